//! The XNNPACK fixtures of `tests/fixtures` (exported and recorded by the official
//! runtime, `tools/fixtures`) whose method is one `DelegateCall`, run on the delegate
//! directly (no runtime): every output within 1e-4 of the official one, relative to the
//! output's largest value. Programs with other instructions run in the runtime's
//! conformance test; here all their delegates must at least initialise. Skipped when
//! the fixtures are absent (`ETCH_XNN_FIXTURES` overrides the directory).
mod common;
use common::*;
use etch_format::{Instruction, ProgramFile, ScalarType, Value};
use etch_kernels::Backend;
use etch_kernels::testing::Harness;
use etch_xnnpack::XnnpackBackend;

fn npy(path: &std::path::Path) -> Option<(Vec<usize>, Vec<f32>)> {
    let b = std::fs::read(path).ok()?;
    let hl = u16::from_le_bytes([b[8], b[9]]) as usize;
    let h = std::str::from_utf8(&b[10..10 + hl]).ok()?;
    assert!(h.contains("'<f4'"), "{h}");
    let s = h.split("'shape': (").nth(1)?.split(')').next()?;
    let shape: Vec<usize> = s.split(',').filter_map(|t| t.trim().parse().ok()).collect();
    Some((shape, bytemuck::pod_collect_to_vec(&b[10 + hl..])))
}

fn fixture_dir() -> Option<String> {
    let dir = std::env::var("ETCH_XNN_FIXTURES").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures").to_string()
    });
    if std::path::Path::new(&dir).join("xnn_conv2d.pte").exists() {
        Some(dir)
    } else {
        eprintln!("no XNNPACK fixtures in {dir}: skipped");
        None
    }
}

#[test]
fn single_delegate_fixtures_match_the_official_runtime() {
    let mut failures = Vec::new();
    let Some(dir) = fixture_dir() else { return };
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| -> Option<String> {
            let p = e.ok()?.path();
            if p.extension()? != "pte" {
                return None;
            }
            Some(p.file_stem()?.to_string_lossy().to_string())
        })
        .collect();
    names.sort();
    for name in names {
        let dirp = std::path::Path::new(&dir);
        let file = ProgramFile::read(dirp.join(format!("{name}.pte"))).unwrap();
        let plan = file.plan("forward").unwrap();
        let instrs = &plan.chains[0].instructions;
        let r: Result<String, String> = (|| {
            if instrs.len() != 1 {
                return Err(format!("{} instructions", instrs.len()));
            }
            let Instruction::DelegateCall {
                delegate_index,
                args,
            } = &instrs[0]
            else {
                return Ok("not delegated: skipped".into());
            };
            let d = &plan.delegates[*delegate_index];
            let range = file
                .delegate_data(&d.processed)
                .map_err(|e| e.to_string())?;
            let bytes = file.slice(range).unwrap().to_vec();
            let named = FileNamedData(&file);
            let handle = XnnpackBackend
                .init(&bytes, &init_ctx(&named))
                .map_err(|e| e.to_string())?;
            let mut h = Harness::with_pool(etch_kernels::ThreadPool::new(2).unwrap());
            let mut idx = Vec::new();
            let mut outs = Vec::new();
            for &a in args {
                let Some(Value::Tensor(t)) = plan.values.get(a) else {
                    return Err("non-tensor arg".into());
                };
                if t.scalar_type != ScalarType::Float {
                    // int8 at the boundary: the runtime's conformance test runs these.
                    return Ok(format!("{} argument: skipped", t.scalar_type));
                }
                if let Some(k) = plan.inputs.iter().position(|&i| i == a) {
                    let (shape, data) =
                        npy(&dirp.join(&name).join(format!("call0.in{k}.npy"))).ok_or("npy")?;
                    idx.push(h.tensor(&shape, &data));
                } else if let Some(k) = plan.outputs.iter().position(|&i| i == a) {
                    let o = h.out(ScalarType::Float, &t.sizes);
                    outs.push((k, o));
                    idx.push(o);
                } else if t.data_buffer_idx > 0 {
                    let r = file
                        .constant_data(t.data_buffer_idx)
                        .map_err(|e| e.to_string())?;
                    let v: Vec<f32> = bytemuck::pod_collect_to_vec(
                        &file.slice(r).unwrap()[..t.sizes.iter().product::<usize>() * 4],
                    );
                    idx.push(h.tensor(&t.sizes, &v));
                } else {
                    return Err("arg neither input, output nor constant".into());
                }
            }
            run(&mut h, handle.as_ref(), &idx).map_err(|e| e.to_string())?;
            let mut worst = 0f32;
            for (k, o) in outs {
                let (shape, want) =
                    npy(&dirp.join(&name).join(format!("call0.out{k}.npy"))).ok_or("npy out")?;
                let meta = h.tensor_meta(o);
                if meta.sizes() != shape.as_slice() {
                    return Err(format!("shape {:?} vs {shape:?}", meta.sizes()));
                }
                let got: Vec<f32> = h.read(o);
                let m = want.iter().fold(0f32, |a, v| a.max(v.abs())).max(1e-30);
                for (g, w) in got.iter().zip(&want) {
                    worst = worst.max((g - w).abs() / m);
                }
            }
            Ok(format!(
                "rel err {worst:.2e} {}",
                if worst <= 1e-4 { "PASS" } else { "FAIL" }
            ))
        })();
        match r {
            Ok(s) => {
                eprintln!("{name}: {s}");
                if s.ends_with("FAIL") {
                    failures.push(format!("{name}: {s}"));
                }
            }
            Err(e) if e.contains("instructions") => eprintln!("{name}: runs in the runtime ({e})"),
            Err(e) if name.starts_with("xnn_q8_") && e.starts_with("unsupported") => {
                eprintln!("{name}: {e}")
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn every_delegate_of_the_llama_and_vit_fixtures_initialises() {
    let Some(dir) = fixture_dir() else { return };
    for name in [
        "tiny_llama_xnnpack",
        "tiny_llama_8da4w_xnnpack",
        "tiny_llama_8da4w_emb4_xnnpack",
        "xnn_vit",
        "xnn_mobilenet_v3_small",
        "xnn_bmm",
        "xnn_reshape",
        "xnn_q8_resnet",
    ] {
        let file =
            ProgramFile::read(std::path::Path::new(&dir).join(format!("{name}.pte"))).unwrap();
        let plan = file.plan("forward").unwrap();
        let named = FileNamedData(&file);
        let mut totals = std::collections::BTreeMap::new();
        let mut errs = Vec::new();
        let mut packed = 0;
        for d in &plan.delegates {
            let range = file.delegate_data(&d.processed).unwrap();
            match XnnpackBackend.init(file.slice(range).unwrap(), &init_ctx(&named)) {
                Ok(h) => {
                    let s = h.summary();
                    packed += s.packed_bytes;
                    for (k, v) in s.nodes {
                        *totals.entry(k).or_insert(0) += v;
                    }
                }
                Err(e) => errs.push(e.to_string()),
            }
        }
        eprintln!(
            "{name}: {} delegates, packed {packed} B, {totals:?}, errors {errs:?}",
            plan.delegates.len()
        );
        if !name.starts_with("xnn_q8_") {
            assert!(errs.is_empty(), "{name}: {errs:?}");
        }
    }
}
