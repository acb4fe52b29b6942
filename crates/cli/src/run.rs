//! `etch run`: run a method on inputs from the command line.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::ArgAction;
use etch_format::ScalarType;
use etch_memory::counting::CountingAllocator;
use etch_runtime::npy::{read_npy, write_npy_file};
use etch_runtime::{HostTensor, Value, ValueInfo};
use serde_json::json;

use crate::image_input::{
    ImageOptions, is_image_path, load_image, parse_resize, parse_std, parse_top_k, parse_triple,
    read_labels, top_k,
};

/// Arguments of `etch run`.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    etch run model.pte --input x.npy --output-dir out/\n  \
    etch run resnet.pte --input cat.jpg --resize 224 --mean 0.485,0.456,0.406 \
    --std 0.229,0.224,0.225 --top-k 5 --labels imagenet_classes.txt")]
pub struct RunArgs {
    /// The .pte file (or a bundled program, .bpte: its program runs).
    file: PathBuf,
    /// The method to run.
    #[arg(long, default_value = "forward")]
    method: String,
    /// An input, in order: a .npy file, an image (.png, .jpg: a f32 [1, 3, H, W]
    /// tensor, RGB in [0, 1]; see --resize, --mean, --std), or a scalar (`3`, `2.5`,
    /// `true`).
    #[arg(long = "input", value_name = "PATH.npy|IMAGE|SCALAR")]
    inputs: Vec<String>,
    /// Starts the inputs of the next call of the same loaded method; state such as a
    /// KV cache carries over (prefill, then decode steps).
    // Each occurrence is one value, so clap reports one position per `--then`.
    #[arg(long = "then", action = ArgAction::Append, num_args = 0,
          default_missing_value = "true", value_parser = clap::value_parser!(bool))]
    then: Vec<bool>,
    /// Where outputs are written: out0.npy, out1.npy, ... (step0.out0.npy, ... with --then).
    #[arg(long, default_value = ".", value_name = "DIR")]
    output_dir: PathBuf,
    /// The dtype of the written outputs. NumPy has no bfloat16, so with `as-is` a bf16
    /// output is written as its raw 16-bit words (`<u2`; `np.load(f).view(ml_dtypes.bfloat16)`
    /// or `torch.from_numpy(a).view(torch.bfloat16)` reads it back); `f32` widens every
    /// floating-point output (bf16, f16, f64) to f32.
    #[arg(long, value_enum, default_value_t = OutputDtype::AsIs, value_name = "DTYPE")]
    output_dtype: OutputDtype,
    /// Runs each call N times, its inputs set again before each, and reports the median
    /// time, with the fastest and slowest run (outputs are from the last run).
    #[arg(long, default_value_t = 1, value_name = "N")]
    repeat: usize,
    /// Runs the first call this many times before any timed run (not timed, not
    /// profiled, not counted in the allocations), as benchmark harnesses do: the first
    /// call of a method touches its memory plan and scratch for the first time. Default:
    /// 1 with --repeat above 1, else 0.
    #[arg(long, value_name = "N")]
    warmup: Option<usize>,
    /// Idle this many milliseconds before each run (not timed), so that each run starts
    /// as an application's occasional call does: the pool's workers asleep, caches and
    /// clocks cooled. 0 runs them back to back.
    #[arg(long, default_value_t = 0.0, value_name = "MS")]
    gap_ms: f64,
    /// Kernel threads (0: one per available core). A pool with one per core pins each to
    /// its core; the environment variable ETCH_PIN_THREADS=0 (never) or 1 (always)
    /// overrides that.
    #[arg(long, default_value_t = 0, value_name = "N")]
    threads: usize,
    /// How to bring the .pte into memory.
    #[arg(long, value_enum, default_value_t = crate::load::LoadArg::Mmap, value_name = "MODE")]
    load: crate::load::LoadArg,
    #[arg(long, value_name = "BYTES", value_parser = crate::load::parse_max_memory,
          long_help = crate::load::MAX_MEMORY_HELP)]
    /// The most memory the program may hold (default: what the system has available).
    max_memory: Option<u64>,
    /// Also report planned memory, folded constants, temp-allocator use and heap
    /// allocations.
    #[arg(long)]
    stats: bool,
    /// Run the instructions as they are, without folding constant work at load.
    #[arg(long, long_help = crate::load::NO_FOLD_HELP)]
    no_fold: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also report time and heap allocations per operator (all calls together); with
    /// `--json`, also per instruction ("profile_steps", in program order). Inside XNNPACK
    /// delegates, time per node kind ("profile_delegate_nodes").
    #[arg(long)]
    profile: bool,
    /// Image inputs (.png, .jpg) are resized to N x N, or H x W, first (bilinear).
    #[arg(long, value_parser = parse_resize, value_name = "N|HxW")]
    resize: Option<(u32, u32)>,
    /// Per-channel mean subtracted from image inputs (RGB, values in [0, 1]).
    #[arg(long, value_parser = parse_triple, value_name = "R,G,B", allow_hyphen_values = true)]
    mean: Option<[f32; 3]>,
    /// Per-channel standard deviation image inputs are divided by (after the mean).
    #[arg(long, value_parser = parse_std, value_name = "R,G,B")]
    std: Option<[f32; 3]>,
    /// Prints the N largest values of output 0 (a float tensor) with their indices,
    /// largest first.
    #[arg(long, value_parser = parse_top_k, value_name = "N")]
    top_k: Option<usize>,
    /// Labels for --top-k, one per line (line i, from 0, names index i). A count that
    /// differs from output 0's length is a warning; indices past the end get no label.
    #[arg(long, value_name = "FILE", requires = "top_k")]
    labels: Option<PathBuf>,
}

fn parse_input(
    text: &str,
    info: Option<&ValueInfo>,
    image: &ImageOptions,
) -> anyhow::Result<Value> {
    if is_image_path(text) {
        return Ok(Value::Tensor(load_image(Path::new(text), image, info)?));
    }
    if let Ok(v) = text.parse::<i64>() {
        return Ok(Value::Int(v));
    }
    if let Ok(v) = text.parse::<f64>() {
        return Ok(Value::Double(v));
    }
    match text {
        "true" | "True" => return Ok(Value::Bool(true)),
        "false" | "False" => return Ok(Value::Bool(false)),
        _ => {}
    }
    let path = Path::new(text);
    let bytes = std::fs::read(path).with_context(|| {
        format!("input {text:?} is neither a number, true/false, nor a readable .npy file")
    })?;
    let mut t = read_npy(&bytes, text)?;
    // bf16 has no NumPy dtype: accept its raw bits stored as uint16.
    if let Some(ValueInfo::Tensor(meta)) = info
        && meta.dtype == ScalarType::BFloat16
        && t.dtype == ScalarType::UInt16
    {
        t.dtype = ScalarType::BFloat16;
    }
    Ok(Value::Tensor(t))
}

fn describe(info: &ValueInfo) -> String {
    match info {
        ValueInfo::Tensor(t) => format!(
            "{} {:?}{}",
            t.dtype,
            t.sizes,
            if t.dynamism == etch_format::ShapeDynamism::Static {
                ""
            } else {
                " (dynamic, upper bound)"
            }
        ),
        other => other.kind().to_string(),
    }
}

/// Splits `--input` values into calls at each `--then`, by position on the command line.
fn split_calls(args: &RunArgs, matches: Option<&clap::ArgMatches>) -> Vec<Vec<String>> {
    let input_pos: Vec<usize> = matches
        .and_then(|m| m.indices_of("inputs"))
        .map(|i| i.collect())
        .unwrap_or_default();
    let then_pos: Vec<usize> = matches
        .filter(|_| !args.then.is_empty())
        .and_then(|m| m.indices_of("then"))
        .map(|i| i.collect())
        .unwrap_or_default();
    let mut calls = vec![Vec::new(); then_pos.len() + 1];
    for (k, value) in args.inputs.iter().enumerate() {
        let pos = input_pos.get(k).copied().unwrap_or(0);
        let call = then_pos.iter().filter(|&&t| t < pos).count();
        calls[call].push(value.clone());
    }
    calls
}

struct CallResult {
    outputs: Vec<Value>,
    /// Run times of the call: median, fastest and slowest. On a shared machine the
    /// spread says how far the median can be trusted; the fastest is what additive
    /// noise cannot lower.
    median: Duration,
    min: Duration,
    max: Duration,
    heap_allocations_per_run: f64,
}

pub fn main(args: RunArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if !(args.gap_ms.is_finite() && (0.0..=60_000.0).contains(&args.gap_ms)) {
        bail!("--gap-ms must be between 0 and 60000 milliseconds");
    }
    let calls = split_calls(&args, matches);
    let image = ImageOptions {
        resize: args.resize,
        mean: args.mean,
        std: args.std,
    };
    if image.any() && !args.inputs.iter().any(|t| is_image_path(t)) {
        bail!(
            "--resize, --mean and --std apply to image inputs (.png, .jpg, .jpeg), and no --input is one"
        );
    }
    let labels = args.labels.as_deref().map(read_labels).transpose()?;
    let load_start = Instant::now();
    // A bundled program (.bpte) runs its wrapped program.
    let mut builder = crate::verify::module_builder(&args.file)?
        .load_mode(args.load.into())
        .threads(args.threads)
        .fold_constants(!args.no_fold);
    if let Some(bytes) = args.max_memory {
        builder = builder.max_memory(bytes);
    }
    let module = builder.build();
    let mut module = crate::load::naming_file(module, &args.file, &[])?;
    let meta = module.method_meta(&args.method)?;
    for (k, call) in calls.iter().enumerate() {
        if call.len() != meta.inputs.len() {
            let expected: Vec<String> = meta
                .inputs
                .iter()
                .enumerate()
                .map(|(i, v)| format!("  input {i}: {}", describe(v)))
                .collect();
            bail!(
                "call {k}: method {:?} takes {} inputs, got {} (give each with --input)\n{}",
                args.method,
                meta.inputs.len(),
                call.len(),
                expected.join("\n")
            );
        }
    }
    let inputs: Vec<Vec<Value>> = calls
        .iter()
        .map(|call| {
            call.iter()
                .enumerate()
                .map(|(i, text)| {
                    parse_input(text, meta.inputs.get(i), &image)
                        .with_context(|| format!("input {i}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .collect::<anyhow::Result<_>>()?;
    module.load_method(&args.method)?;
    let load_time = load_start.elapsed();
    let warmup = args.warmup.unwrap_or(usize::from(args.repeat > 1));
    if let Some(first) = inputs.first() {
        for _ in 0..warmup {
            let method = module.method_mut(&args.method)?;
            method.set_inputs(first).context("warm-up call")?;
            method.execute().context("warm-up call")?;
        }
    }
    module.method_mut(&args.method)?.set_profiling(args.profile);

    let mut results = Vec::new();
    for (k, call_inputs) in inputs.iter().enumerate() {
        let mut times = Vec::with_capacity(args.repeat);
        let mut allocations = 0;
        for _ in 0..args.repeat {
            // Inputs again before every repetition: the memory plan may reuse an
            // input's buffer once the input is dead, so a call can overwrite it.
            module
                .method_mut(&args.method)?
                .set_inputs(call_inputs)
                .with_context(|| format!("call {k}"))?;
            if args.gap_ms > 0.0 {
                std::thread::sleep(std::time::Duration::from_secs_f64(args.gap_ms / 1e3));
            }
            let before = CountingAllocator::global_counts();
            let start = Instant::now();
            module
                .method_mut(&args.method)?
                .execute()
                .with_context(|| format!("call {k}"))?;
            times.push(start.elapsed());
            allocations += CountingAllocator::global_counts()
                .since(&before)
                .allocations;
        }
        times.sort();
        let outputs = module.method_mut(&args.method)?.outputs()?;
        results.push(CallResult {
            outputs,
            median: times[times.len() / 2],
            min: times[0],
            max: times[times.len() - 1],
            heap_allocations_per_run: allocations as f64 / args.repeat as f64,
        });
    }

    // The top-k of output 0 of each call, before anything is written.
    let mut top: Vec<Vec<(usize, f32)>> = Vec::new();
    if let Some(n) = args.top_k {
        for (k, r) in results.iter().enumerate() {
            let best = match r.outputs.first() {
                Some(Value::Tensor(t)) => top_k(t, n).map(|best| (best, t.numel())),
                _ => None,
            };
            let Some((best, len)) = best else {
                bail!(
                    "call {k}: --top-k needs output 0 to be a float tensor, it is {}",
                    r.outputs
                        .first()
                        .map(scalar_text)
                        .unwrap_or("missing".into())
                );
            };
            // A warning, not an error: label files often differ by a background class.
            if let (Some(labels), Some(path), 0) = (&labels, &args.labels, k)
                && labels.len() != len
            {
                eprintln!(
                    "warning: {} has {} labels but output 0 has {len} values; \
                     indices past the last label print none",
                    path.display(),
                    labels.len()
                );
            }
            top.push(best);
        }
    }
    let label_of = |i: usize| labels.as_ref().and_then(|l| l.get(i));

    // Everything ran: only now write files, so a failure leaves no partial output.
    let multi = results.len() > 1;
    let mut written = Vec::new();
    for (k, r) in results.iter().enumerate() {
        for (j, v) in r.outputs.iter().enumerate() {
            if let Value::Tensor(t) = v {
                std::fs::create_dir_all(&args.output_dir)
                    .with_context(|| format!("cannot create {}", args.output_dir.display()))?;
                let name = if multi {
                    format!("step{k}.out{j}.npy")
                } else {
                    format!("out{j}.npy")
                };
                let path = args.output_dir.join(name);
                match args.output_dtype {
                    OutputDtype::AsIs => write_npy_file(&path, t)?,
                    OutputDtype::F32 => write_npy_file(&path, &widened_to_f32(t))?,
                }
                written.push((k, j, path));
            }
        }
    }

    let method = module.method_mut(&args.method)?;
    let method_stats = method.stats();
    let profile = method.profile().map(aggregate_profile).unwrap_or_default();
    let profile_steps: Vec<_> = method
        .profile()
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({
                "step": i, "operator": s.name, "calls": s.calls,
                "ms": s.nanos as f64 / 1e6, "heap_allocations": s.heap_allocations,
            })
        })
        .collect();
    // Inside the delegates, slowest node kind first.
    let mut delegate_nodes = method.delegate_node_profile();
    delegate_nodes.sort_by_key(|n| std::cmp::Reverse(n.nanos));
    let folded_bytes = method.plan().folded_bytes();
    let folded_steps = method.plan().folded_steps();
    let planned = module.planned_bytes();
    let temp = module.temp_allocator_stats();
    if args.json {
        let calls_json: Vec<_> = results
            .iter()
            .enumerate()
            .map(|(k, r)| {
                let outputs: Vec<_> = r
                    .outputs
                    .iter()
                    .enumerate()
                    .map(|(j, v)| {
                        let mut o = output_json(
                            v,
                            written.iter().find(|w| w.0 == k && w.1 == j).map(|w| &w.2),
                        );
                        if let (0, Some(best)) = (j, top.get(k)) {
                            o["top_k"] = json!(
                                best.iter()
                                    .map(|&(i, v)| json!({
                                        "index": i,
                                        "value": v,
                                        "label": label_of(i),
                                    }))
                                    .collect::<Vec<_>>()
                            );
                        }
                        o
                    })
                    .collect();
                json!({
                    "outputs": outputs,
                    "median_ms": r.median.as_secs_f64() * 1e3,
                    "min_ms": r.min.as_secs_f64() * 1e3,
                    "max_ms": r.max.as_secs_f64() * 1e3,
                    "heap_allocations_per_run": r.heap_allocations_per_run,
                })
            })
            .collect();
        let mut obj = json!({
            "file": args.file.display().to_string(),
            "method": args.method,
            "threads": module.pool().threads(),
            "load_ms": load_time.as_secs_f64() * 1e3,
            "calls": calls_json,
        });
        if args.profile {
            obj["profile"] = json!(profile
                .iter()
                .map(|(name, calls, nanos, allocs)| json!({
                    "operator": name, "calls": calls, "ms": *nanos as f64 / 1e6, "heap_allocations": allocs,
                }))
                .collect::<Vec<_>>());
            obj["profile_steps"] = json!(profile_steps);
            obj["profile_delegate_nodes"] = json!(delegate_nodes
                .iter()
                .map(|n| json!({
                    "backend": n.backend, "node": n.node, "runs": n.runs, "ms": n.nanos as f64 / 1e6,
                }))
                .collect::<Vec<_>>());
        }
        if args.stats {
            obj["stats"] = json!({
                "planned_bytes": planned,
                "folded_bytes": folded_bytes,
                "folded_constant_steps": folded_steps.constant_steps,
                "folded_batch_norms": folded_steps.batch_norms,
                "folded_activations": folded_steps.activations,
                "unread_indices": folded_steps.unread_indices,
                "input_major_filters": folded_steps.input_major_filters,
                "temp_peak_bytes": temp.peak_bytes_live,
                "temp_hits": temp.hits,
                "temp_misses": temp.misses,
                "temp_system_allocations": temp.system_allocations,
                "scratch_fallbacks": method_stats.scratch_fallbacks,
            });
        }
        println!("{}", serde_json::to_string_pretty(&obj)?);
        return Ok(());
    }
    for (k, r) in results.iter().enumerate() {
        let prefix = if multi {
            format!("step {k}: ")
        } else {
            String::new()
        };
        for (j, v) in r.outputs.iter().enumerate() {
            match (v, written.iter().find(|w| w.0 == k && w.1 == j)) {
                (Value::Tensor(t), Some((_, _, path))) => {
                    println!(
                        "{prefix}output {j}: {} {:?} -> {}",
                        t.dtype,
                        t.sizes,
                        path.display()
                    )
                }
                (other, _) => println!("{prefix}output {j}: {}", scalar_text(other)),
            }
            if let (0, Some(best)) = (j, top.get(k)) {
                println!("{prefix}top {} of output 0:", best.len());
                for (rank, (i, value)) in best.iter().enumerate() {
                    let label = label_of(*i).map(|l| format!("  {l}")).unwrap_or_default();
                    println!("  {:>3}. [{i}] {value:.6}{label}", rank + 1);
                }
            }
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        if args.repeat > 1 {
            println!(
                "{prefix}time: {:.3} ms (median of {}; fastest {:.3} ms, slowest {:.3} ms)",
                ms(r.median),
                args.repeat,
                ms(r.min),
                ms(r.max)
            );
        } else {
            println!("{prefix}time: {:.3} ms", ms(r.median));
        }
    }
    if args.profile {
        println!(
            "{:<48} {:>7} {:>10} {:>12}",
            "operator", "calls", "ms", "heap allocs"
        );
        for (name, calls, nanos, allocs) in &profile {
            println!(
                "{name:<48} {calls:>7} {:>10.3} {allocs:>12}",
                *nanos as f64 / 1e6
            );
        }
        if !delegate_nodes.is_empty() {
            println!(
                "{:<48} {:>7} {:>10}",
                "inside delegates: node", "runs", "ms"
            );
            for n in &delegate_nodes {
                let name = format!("{}: {}", n.backend, n.node);
                println!("{name:<48} {:>7} {:>10.3}", n.runs, n.nanos as f64 / 1e6);
            }
        }
    }
    if args.stats {
        println!("load: {:.1} ms", load_time.as_secs_f64() * 1e3);
        println!("threads: {}", module.pool().threads());
        println!("planned memory: {planned} bytes");
        println!(
            "folded constants: {folded_bytes} bytes ({} constant steps run at load, {} batch \
             norms and {} activations folded into convolutions, {} max poolings writing no \
             indices, {} convolution filters stored input-channel major)",
            folded_steps.constant_steps,
            folded_steps.batch_norms,
            folded_steps.activations,
            folded_steps.unread_indices,
            folded_steps.input_major_filters
        );
        println!(
            "temp allocator: peak {} bytes live, {} hits, {} misses, {} system allocations",
            temp.peak_bytes_live, temp.hits, temp.misses, temp.system_allocations
        );
        println!("scratch heap fallbacks: {}", method_stats.scratch_fallbacks);
        for (k, r) in results.iter().enumerate() {
            println!(
                "heap allocations during execute (call {k}): {:.1} per run",
                r.heap_allocations_per_run
            );
        }
    }
    Ok(())
}

/// Sums per-instruction measurements by operator, slowest first.
fn aggregate_profile(steps: &[etch_runtime::InstructionProfile]) -> Vec<(String, u64, u64, u64)> {
    let mut rows: Vec<(String, u64, u64, u64)> = Vec::new();
    for s in steps {
        match rows.iter_mut().find(|r| r.0 == s.name) {
            Some(r) => {
                r.1 += s.calls;
                r.2 += s.nanos;
                r.3 += s.heap_allocations;
            }
            None => rows.push((s.name.clone(), s.calls, s.nanos, s.heap_allocations)),
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.2));
    rows
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Int(i) => i.to_string(),
        Value::Double(d) => d.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Tensor(t) => format!("{} {:?}", t.dtype, t.sizes),
    }
}

fn output_json(v: &Value, path: Option<&PathBuf>) -> serde_json::Value {
    match v {
        Value::Tensor(HostTensor { dtype, sizes, .. }) => json!({
            "dtype": dtype.name(),
            "shape": sizes,
            "file": path.map(|p| p.display().to_string()),
        }),
        Value::Int(i) => json!({ "int": i }),
        Value::Double(d) => json!({ "double": d }),
        Value::Bool(b) => json!({ "bool": b }),
        Value::String(s) => json!({ "string": s }),
        Value::None => json!(null),
    }
}

/// The dtype `etch run` writes its outputs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputDtype {
    /// Each output's own dtype (bf16 as raw 16-bit words).
    AsIs,
    /// Floating-point outputs widened (or narrowed, for f64) to f32; others as they are.
    F32,
}

/// `t` as f32 when it is a floating-point tensor of another width.
fn widened_to_f32(t: &HostTensor) -> std::borrow::Cow<'_, HostTensor> {
    let values: Option<Vec<f32>> = match t.dtype {
        ScalarType::BFloat16 => t
            .as_slice::<half::bf16>()
            .map(|v| v.iter().map(|x| x.to_f32()).collect()),
        ScalarType::Half => t
            .as_slice::<half::f16>()
            .map(|v| v.iter().map(|x| x.to_f32()).collect()),
        ScalarType::Double => t
            .as_slice::<f64>()
            .map(|v| v.iter().map(|&x| x as f32).collect()),
        _ => None,
    };
    match values {
        Some(v) => std::borrow::Cow::Owned(HostTensor::from_slice(&t.sizes, &v)),
        None => std::borrow::Cow::Borrowed(t),
    }
}
