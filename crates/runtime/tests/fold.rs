//! Load-time folding (`MethodPlan::load`): constant steps run once, batch norms folded
//! into convolutions. Small programs written with the format crate's test writer show
//! each rule (what folds, what must not); the vision fixtures show that it happens on
//! exported programs and leaves their outputs within tolerance.

#[path = "../../format/tests/common/mod.rs"]
mod common;

use common::program::{ChainB, InstrB, PlanB, ProgramB, TensorB, ValueB, f32_bytes};
use etch_kernels::ops::conv::prefers_input_major_filter;
use etch_memory::SharedBytes;
use etch_runtime::npy::read_npy_file;
use etch_runtime::{FoldCounts, HostTensor, Method, Program, RuntimeError, Value};

/// A one-method program under construction: values, constants, instructions.
#[derive(Default)]
struct Net {
    values: Vec<ValueB>,
    constants: Vec<u8>,
    /// Offset of each constant (entry 0 reserved).
    offsets: Vec<u64>,
    instructions: Vec<InstrB>,
    operators: Vec<String>,
    /// Bytes of planned buffer 1.
    planned: u32,
}

impl Net {
    fn new(planned: u32) -> Self {
        Net {
            offsets: vec![0],
            planned,
            ..Default::default()
        }
    }

    fn push(&mut self, v: ValueB) -> i32 {
        self.values.push(v);
        self.values.len() as i32 - 1
    }

    /// An f32 tensor in planned buffer 1 at `offset`.
    fn at(&mut self, sizes: &[i32], offset: u32) -> i32 {
        self.push(ValueB::Tensor(TensorB::f32(sizes).planned(1, offset)))
    }

    fn constant(&mut self, sizes: &[i32], data: &[f32]) -> i32 {
        while !self.constants.len().is_multiple_of(16) {
            self.constants.push(0);
        }
        self.offsets.push(self.constants.len() as u64);
        self.constants.extend(f32_bytes(data));
        let idx = self.offsets.len() as u32 - 1;
        self.push(ValueB::Tensor(TensorB::f32(sizes).constant(idx)))
    }

    fn ints(&mut self, items: &[i64]) -> i32 {
        let ids: Vec<i64> = items
            .iter()
            .map(|&i| self.push(ValueB::Int(i)) as i64)
            .collect();
        self.push(ValueB::IntList(ids))
    }

    fn op(&mut self, name: &str, args: &[i32]) {
        let index = match self.operators.iter().position(|o| o == name) {
            Some(i) => i,
            None => {
                self.operators.push(name.to_string());
                self.operators.len() - 1
            }
        };
        self.instructions
            .push(InstrB::Kernel(index as i32, args.to_vec()));
    }

    /// `convolution.out(x, w, bias)` with stride 1, padding 1, one group, into `out`.
    fn conv_3x3_padded(&mut self, x: i32, w: i32, bias: i32, transposed: bool, out: i32) {
        self.conv(x, w, bias, (transposed, 1), out);
    }

    /// A 2-d convolution with stride 1 and `pad` on every side.
    fn conv(&mut self, x: i32, w: i32, bias: i32, (transposed, pad): (bool, i64), out: i32) {
        let stride = self.ints(&[1, 1]);
        let padding = self.ints(&[pad, pad]);
        let dilation = self.ints(&[1, 1]);
        let tr = self.push(ValueB::Bool(transposed));
        let output_padding = self.ints(&[0, 0]);
        let groups = self.push(ValueB::Int(1));
        let args = [
            x,
            w,
            bias,
            stride,
            padding,
            dilation,
            tr,
            output_padding,
            groups,
            out,
            out,
        ];
        self.op("aten::convolution.out", &args);
    }

    fn bytes(self, inputs: &[i32], outputs: &[i32]) -> SharedBytes {
        let operators = self
            .operators
            .iter()
            .map(|q| {
                let (name, overload) = q.split_once('.').unwrap_or((q, ""));
                (name.as_bytes().to_vec(), overload.to_string())
            })
            .collect();
        let plan = PlanB {
            name: Some(b"forward".to_vec()),
            values: self.values,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            chains: vec![ChainB {
                inputs: inputs.to_vec(),
                outputs: outputs.to_vec(),
                instructions: self.instructions,
            }],
            operators,
            delegates: vec![],
            non_const_buffer_sizes: vec![0, self.planned as i64],
        };
        let program = ProgramB {
            plans: vec![plan],
            segments: vec![self.constants],
            constant_segment: Some((0, self.offsets)),
            extended_header: true,
            ..Default::default()
        };
        SharedBytes::from_vec_aligned(program.to_bytes()).unwrap()
    }
}

fn program(bytes: &SharedBytes, fold: bool) -> Program {
    Program::from_bytes(bytes.clone())
        .fold_constants(fold)
        .threads(1)
        .build_program()
        .unwrap()
}

fn run(method: &mut Method, inputs: &[HostTensor]) -> Vec<f32> {
    let inputs: Vec<Value> = inputs.iter().cloned().map(Value::Tensor).collect();
    method.set_inputs(&inputs).unwrap();
    method.execute().unwrap();
    match &method.outputs().unwrap()[0] {
        Value::Tensor(t) => t.as_slice::<f32>().unwrap(),
        other => panic!("output is {other:?}"),
    }
}

/// `forward`'s instruction count and folded bytes, with folding on.
fn folded(bytes: &SharedBytes) -> (usize, usize) {
    let plan = program(bytes, true).plan("forward").unwrap();
    (plan.instruction_count(), plan.folded_bytes())
}

/// Output 0 of `forward` and its instruction count, with folding on and off.
fn both_ways(bytes: &SharedBytes, inputs: &[HostTensor]) -> [(Vec<f32>, usize); 2] {
    [true, false].map(|fold| {
        let mut m = program(bytes, fold).method("forward").unwrap();
        (run(&mut m, inputs), m.instruction_count())
    })
}

fn assert_close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-5 * scale, "element {i}: {x} vs {y}");
    }
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) * scale)
        .collect()
}

/// `y = x @ permute(w, [1, 0])`: the permute of the constant folds, the matmul stays.
/// With `through_view`, the matmul reads the permute's out through a planned tensor at
/// the same bytes that no step writes.
fn permute_then_mm(through_view: bool) -> (SharedBytes, HostTensor, Vec<f32>) {
    let w = ramp(12, 0.5);
    let mut n = Net::new(256);
    let x = n.at(&[2, 3], 0);
    let wv = n.constant(&[4, 3], &w);
    let dims = n.ints(&[1, 0]);
    let wt = n.at(&[3, 4], 64);
    let rhs = if through_view { n.at(&[3, 4], 64) } else { wt };
    let y = n.at(&[2, 4], 128);
    n.op("aten::permute_copy.out", &[wv, dims, wt, wt]);
    n.op("aten::mm.out", &[x, rhs, y, y]);
    let xs = ramp(6, 1.0);
    let expected = (0..8)
        .map(|k| (0..3).map(|j| xs[k / 4 * 3 + j] * w[k % 4 * 3 + j]).sum())
        .collect();
    (
        n.bytes(&[x], &[y]),
        HostTensor::from_slice(&[2, 3], &xs),
        expected,
    )
}

#[test]
fn a_permute_of_a_constant_runs_once_at_load() {
    let (bytes, x, expected) = permute_then_mm(false);
    let [(on, on_count), (off, off_count)] = both_ways(&bytes, std::slice::from_ref(&x));
    assert_eq!((on_count, off_count), (1, 2));
    assert_eq!(on, expected);
    assert_eq!(off, expected);
    let p = program(&bytes, true);
    let plan = p.plan("forward").unwrap();
    assert_eq!(
        plan.folded_steps(),
        FoldCounts {
            constant_steps: 1,
            ..Default::default()
        }
    );
    assert_eq!(plan.folded_bytes(), 64, "48 bytes, rounded to a cache line");
    // The folded constant is made once and held by the plan, not by each session.
    assert_eq!(p.memory_budget().in_use(), 64);
    let mut a = p.method("forward").unwrap();
    let mut b = p.method("forward").unwrap();
    assert_eq!(run(&mut a, std::slice::from_ref(&x)), expected);
    assert_eq!(run(&mut b, std::slice::from_ref(&x)), expected);
    // Profiles name the instructions that remain.
    a.set_profiling(true);
    let names: Vec<String> = a
        .profile()
        .unwrap()
        .iter()
        .map(|p| p.name.clone())
        .collect();
    assert_eq!(names, ["aten::mm.out"]);
}

#[test]
fn folded_constants_are_held_against_the_budget() {
    let (bytes, _, _) = permute_then_mm(false);
    // Room for the 64-byte scratch the permute runs into, not also for the result.
    let tight = || {
        Program::from_bytes(bytes.clone())
            .max_memory(100)
            .threads(1)
    };
    let p = tight().build_program().unwrap();
    let err = p
        .plan("forward")
        .expect_err("folded bytes exceed the budget");
    match err {
        RuntimeError::MemoryBudget(e) => {
            assert!(
                e.what.contains("folded constants") && e.what.contains("forward"),
                "{}",
                e.what
            );
            assert_eq!(e.needed, 64);
        }
        other => panic!("{other}"),
    }
    assert_eq!(p.memory_budget().in_use(), 0, "a failed load holds nothing");
    let p = tight().fold_constants(false).build_program().unwrap();
    assert_eq!(p.plan("forward").unwrap().folded_bytes(), 0);
}

/// A net with an input `x` `[2, 3]` and a first step `wt = permute(w, dims)` of a
/// constant `w` `[3, 2]`, `dims` being `[1, 0]`: `(net, x, dims, wt)`.
fn input_and_permuted_constant() -> (Net, i32, i32, i32) {
    let mut n = Net::new(256);
    let x = n.at(&[2, 3], 0);
    let w = n.constant(&[3, 2], &ramp(6, 1.0));
    let dims = n.ints(&[1, 0]);
    let wt = n.at(&[2, 3], 64);
    n.op("aten::permute_copy.out", &[w, dims, wt, wt]);
    (n, x, dims, wt)
}

/// A step whose input is not a constant, or whose out is an output, stays.
#[test]
fn steps_reading_activations_or_writing_outputs_stay() {
    let (mut n, x, dims, wt) = input_and_permuted_constant();
    let xt = n.at(&[3, 2], 128);
    n.op("aten::permute_copy.out", &[x, dims, xt, xt]);
    // Both outs are outputs: nothing folds.
    assert_eq!(folded(&n.bytes(&[x], &[wt, xt])), (2, 0));
}

/// A planned tensor that no step writes, at the bytes of a constant step's out: the
/// exporter's form of a static view (`memory.view` gives the view its base's planned
/// bytes and emits no step). The view reads the permute's result, so folding must not
/// stop writing those bytes.
#[test]
fn a_planned_view_of_a_constant_steps_out_still_sees_its_bytes() {
    let (bytes, x, expected) = permute_then_mm(true);
    let [(on, _), (off, _)] = both_ways(&bytes, std::slice::from_ref(&x));
    assert_eq!(off, expected);
    assert_eq!(on, expected);
}

/// Planned offsets of the conv + batch norm programs.
struct Layout {
    x: u32,
    conv_out: u32,
    out0: u32,
    /// Where the relu after the batch norm writes.
    relu: u32,
    planned: u32,
}

/// How [`conv_bn_relu`] differs from the plain chain.
#[derive(Default)]
struct Variant {
    transposed: bool,
    /// A step reads the batch norm's mean out.
    extra_reader: bool,
    /// The weight is stored channels-last (dim order `[0, 2, 3, 1]`).
    channels_last_weight: bool,
    /// A 1x1 convolution without padding rather than 3x3 with padding 1.
    pointwise: bool,
}

/// `relu(batch_norm(conv(x, W, None)))` over `[1, 3, 4, 4]` with a 3x3 kernel, padding 1,
/// to 3 channels (so that a transposed weight has the same shape). Returns the program
/// and its input.
fn conv_bn_relu(layout: &Layout, variant: Variant) -> (SharedBytes, HostTensor) {
    let mut n = Net::new(layout.planned);
    let x = n.at(&[1, 3, 4, 4], layout.x);
    let (k, pad) = if variant.pointwise { (1, 0) } else { (3, 1) };
    let w = n.constant(&[3, 3, k, k], &ramp(9 * (k * k) as usize, 0.25));
    if let (true, ValueB::Tensor(t)) = (variant.channels_last_weight, &mut n.values[w as usize]) {
        t.dim_order = Some(vec![0, 2, 3, 1]);
    }
    let bias = n.push(ValueB::Null);
    let o = n.at(&[1, 3, 4, 4], layout.conv_out);
    n.conv(x, w, bias, (variant.transposed, pad as i64), o);
    let gamma = n.constant(&[3], &[1.5, -0.5, 2.0]);
    let beta = n.constant(&[3], &[0.1, 0.2, -0.3]);
    let mean = n.constant(&[3], &[0.5, -1.0, 0.25]);
    let var = n.constant(&[3], &[2.0, 0.5, 1.0]);
    let momentum = n.push(ValueB::Double(0.1));
    let eps = n.push(ValueB::Double(1e-5));
    let out0 = n.at(&[1, 3, 4, 4], layout.out0);
    // The mean and invstd outs hold nothing (the kernel resizes them to [0]).
    let out1 = n.at(&[0], 0);
    let out2 = n.at(&[0], 0);
    let outs = n.push(ValueB::TensorList(vec![out0, out1, out2]));
    n.op(
        "aten::_native_batch_norm_legit_no_training.out",
        &[
            o, gamma, beta, mean, var, momentum, eps, out0, out1, out2, outs,
        ],
    );
    let y = n.at(&[1, 3, 4, 4], layout.relu);
    n.op("aten::relu.out", &[out0, y, y]);
    let mut outputs = vec![y];
    if variant.extra_reader {
        // A step reading the batch norm's mean out: the batch norm must stay.
        let format = n.push(ValueB::Null);
        let m = n.at(&[0], 0);
        n.op("aten::clone.out", &[out1, format, m, m]);
        outputs.push(m);
    }
    let x_data = ramp(48, 0.3);
    (
        n.bytes(&[x], &outputs),
        HostTensor::from_slice(&[1, 3, 4, 4], &x_data),
    )
}

/// Every tensor is `[1, 3, 4, 4]` f32: 192 bytes.
const SEPARATE: Layout = Layout {
    x: 0,
    conv_out: 256,
    out0: 512,
    relu: 768,
    planned: 1024,
};

#[test]
fn a_batch_norm_after_a_convolution_folds_into_it() {
    for channels_last_weight in [false, true] {
        let variant = Variant {
            channels_last_weight,
            ..Default::default()
        };
        let (bytes, x) = conv_bn_relu(&SEPARATE, variant);
        let [(on, on_count), (off, off_count)] = both_ways(&bytes, std::slice::from_ref(&x));
        // The relu folds too: one convolution step is left.
        assert_eq!((on_count, off_count), (1, 3));
        assert_close(&on, &off);
        let plan = program(&bytes, true).plan("forward").unwrap();
        // Over 4x4 planes the contiguous filter is stored input-channel major where the
        // CPU has the kernel for it.
        let input_major =
            usize::from(prefers_input_major_filter(16, 27, 9) && !channels_last_weight);
        assert_eq!(
            plan.folded_steps(),
            FoldCounts {
                batch_norms: 1,
                activations: 1,
                input_major_filters: input_major,
                ..Default::default()
            }
        );
        // A [3, 3, 3, 3] weight (324 bytes) and a [3] bias, each on a cache line.
        assert_eq!(plan.folded_bytes(), 384 + 64);
    }
}

#[test]
fn small_plane_pointwise_filters_are_stored_input_major() {
    // Where the CPU has the channels-in-lanes kernel, a 1x1 convolution over 4x4
    // planes reads its filter `[c_in, c_out]`: the batch norm fold makes it so (one
    // copy: a [3, 3, 1, 1] weight and a [3] bias, each on a cache line).
    let stored = usize::from(prefers_input_major_filter(16, 3, 1));
    let variant = Variant {
        pointwise: true,
        ..Default::default()
    };
    let (bytes, x) = conv_bn_relu(&SEPARATE, variant);
    let [(on, on_count), (off, _)] = both_ways(&bytes, std::slice::from_ref(&x));
    assert_eq!(on_count, 1);
    assert_close(&on, &off);
    let plan = program(&bytes, true).plan("forward").unwrap();
    assert_eq!(plan.folded_steps().input_major_filters, stored);
    assert_eq!(plan.folded_bytes(), 64 + 64);

    // Without a batch norm, the file's filter is stored so as a new constant (8 input
    // channels to 5: 160 bytes), also with padding (the kernel then reads im2col rows).
    for pad in [0, 1] {
        let want = stored;
        let mut n = Net::new(2048);
        let x = n.at(&[1, 8, 4, 4], 0);
        let w = n.constant(&[5, 8, 1, 1], &ramp(40, 0.25));
        let bias = n.constant(&[5], &[0.5, -0.25, 0.0, 1.0, -1.0]);
        let side = 4 + 2 * pad as i32;
        let o = n.at(&[1, 5, side, side], 1024);
        n.conv(x, w, bias, (false, pad), o);
        let bytes = n.bytes(&[x], &[o]);
        let x = HostTensor::from_slice(&[1, 8, 4, 4], &ramp(128, 0.3));
        let [(on, _), (off, _)] = both_ways(&bytes, std::slice::from_ref(&x));
        assert_close(&on, &off);
        let plan = program(&bytes, true).plan("forward").unwrap();
        assert_eq!(
            plan.folded_steps().input_major_filters,
            want,
            "padding {pad}"
        );
        assert_eq!(plan.folded_bytes(), 192 * want, "padding {pad}");
    }
}

#[test]
fn the_folded_convolution_moves_its_out_off_its_input() {
    // As a memory planner lays a chain out: the batch norm's out takes the bytes of
    // the convolution's input (dead by then), the relu's those of the convolution's
    // out. The convolution cannot write either while it runs, so the batch norm's out
    // moves to free bytes of the plan, if there are any.
    let chain = Layout {
        x: 0,
        conv_out: 256,
        out0: 0,
        relu: 256,
        planned: 1024,
    };
    let (bytes, x) = conv_bn_relu(&chain, Variant::default());
    let [(on, on_count), (off, off_count)] = both_ways(&bytes, std::slice::from_ref(&x));
    assert_eq!((on_count, off_count), (1, 3));
    assert_close(&on, &off);

    // No free bytes for the batch norm's out at the convolution; but the relu's out,
    // in the convolution's out's bytes, is free there: the convolution writes it, with
    // the relu as its epilogue.
    let full = Layout {
        planned: 448,
        ..chain
    };
    let (bytes, x) = conv_bn_relu(&full, Variant::default());
    let [(on, on_count), (off, _)] = both_ways(&bytes, std::slice::from_ref(&x));
    assert_eq!(on_count, 1);
    assert_close(&on, &off);
}

#[test]
fn batch_norms_that_must_stay() {
    // Its mean out is read by another step.
    let extra_reader = Variant {
        extra_reader: true,
        ..Default::default()
    };
    let (bytes, x) = conv_bn_relu(&SEPARATE, extra_reader);
    let [(on, on_count), (off, _)] = both_ways(&bytes, std::slice::from_ref(&x));
    assert_eq!(on_count, 4);
    assert_eq!(on, off);
    // After a transposed convolution (its weight is [C_in, C_out, ..], scaled per
    // column, not per row).
    let transposed = Variant {
        transposed: true,
        ..Default::default()
    };
    let (bytes, x) = conv_bn_relu(&SEPARATE, transposed);
    let [(on, on_count), (off, _)] = both_ways(&bytes, std::slice::from_ref(&x));
    assert_eq!(on_count, 3);
    assert_eq!(on, off);
}

/// `hardtanh(conv(x, W, b), lo, hi)` (3 input channels to 2, 3x3, padding 1) over
/// `[1, 3, 4, 4]`; with `second_reader`, the convolution's out is also an output.
fn conv_hardtanh(lo: f64, hi: f64, second_reader: bool) -> (SharedBytes, HostTensor) {
    let mut n = Net::new(512);
    let x = n.at(&[1, 3, 4, 4], 0);
    let w = n.constant(&[2, 3, 3, 3], &ramp(54, 0.25));
    let bias = n.constant(&[2], &[0.5, -0.25]);
    let o = n.at(&[1, 2, 4, 4], 192);
    n.conv_3x3_padded(x, w, bias, false, o);
    let (lo, hi) = (n.push(ValueB::Double(lo)), n.push(ValueB::Double(hi)));
    let y = n.at(&[1, 2, 4, 4], 320);
    n.op("aten::hardtanh.out", &[o, lo, hi, y, y]);
    let outputs = if second_reader { vec![y, o] } else { vec![y] };
    let x_data: Vec<f32> = ramp(48, 0.3).iter().map(|v| v - 0.4).collect();
    (
        n.bytes(&[x], &outputs),
        HostTensor::from_slice(&[1, 3, 4, 4], &x_data),
    )
}

#[test]
fn an_activation_after_a_convolution_becomes_its_output_clamp() {
    let (bytes, x) = conv_hardtanh(-1.0, 2.5, false);
    let [(on, on_count), (off, off_count)] = both_ways(&bytes, std::slice::from_ref(&x));
    assert_eq!((on_count, off_count), (1, 2));
    // The same values the activation computes, to the bit; and some were clamped.
    assert_eq!(on, off);
    assert!(off.contains(&-1.0) && off.contains(&2.5), "{off:?}");
    let plan = program(&bytes, true).plan("forward").unwrap();
    let counts = plan.folded_steps();
    // Over 4x4 planes the filter (216 bytes) is stored input-channel major where the
    // CPU has the kernel for it.
    let stored = if prefers_input_major_filter(16, 27, 9) {
        256
    } else {
        0
    };
    assert_eq!((counts.activations, plan.folded_bytes()), (1, stored));

    // Stays: the convolution's out is read by more than the activation (an output
    // here), or the bounds are an empty range (hardtanh then fills in a bound).
    for (lo, hi, second_reader) in [(-1.0, 2.5, true), (3.0, 1.0, false)] {
        let (bytes, x) = conv_hardtanh(lo, hi, second_reader);
        let [(on, on_count), (off, _)] = both_ways(&bytes, std::slice::from_ref(&x));
        assert_eq!(on_count, 2, "[{lo}, {hi}], second reader {second_reader}");
        assert_eq!(on, off);
    }
}

#[test]
fn methods_with_jumps_are_not_folded() {
    let (mut n, x, _, wt) = input_and_permuted_constant();
    let y = n.at(&[2, 3], 128);
    let cond = n.push(ValueB::Bool(true));
    let one = n.push(ValueB::Int(1));
    n.instructions.push(InstrB::JumpFalse(cond, 2));
    n.op("aten::add.out", &[x, wt, one, y, y]);
    assert_eq!(folded(&n.bytes(&[x], &[y])), (3, 0));
}

fn fixtures() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// How many instructions of `method` call `op`.
fn count(method: &mut Method, op: &str) -> usize {
    method.set_profiling(true);
    let n = method
        .profile()
        .unwrap()
        .iter()
        .filter(|p| p.name == op)
        .count();
    method.set_profiling(false);
    n
}

const BATCH_NORM: &str = "aten::_native_batch_norm_legit_no_training.out";
const PERMUTE: &str = "aten::permute_copy.out";

#[test]
fn vision_fixtures_fold_and_keep_their_outputs() {
    // (fixture, batch norms and permutes left after folding, max poolings whose
    // indices nothing reads)
    for (name, left, unread_indices) in [
        ("vision_mobilenet_v3_small", (0, 0), 0),
        // Their first batch norm folds with the activation after it: at the first
        // convolution the plan has no free bytes for the batch norm's out, but has the
        // activation's.
        ("vision_mobilenet_v2", (0, 0), 0),
        ("vision_resnet", (0, 0), 1),
    ] {
        let dir = fixtures();
        let input = read_npy_file(&dir.join(name).join("call0.in0.npy")).unwrap();
        let path = dir.join(format!("{name}.pte"));
        let outputs = [true, false].map(|fold| {
            let p = Program::from_path(&path)
                .fold_constants(fold)
                .threads(1)
                .build_program()
                .unwrap();
            let mut m = p.method("forward").unwrap();
            let counts = (count(&mut m, BATCH_NORM), count(&mut m, PERMUTE));
            if fold {
                assert_eq!(counts, left, "{name}");
                let folded = p.plan("forward").unwrap().folded_steps();
                assert!(folded.activations > 0, "{name}: {folded:?}");
                assert_eq!(folded.unread_indices, unread_indices, "{name}");
                assert!(p.plan("forward").unwrap().folded_bytes() > 0, "{name}");
            } else {
                assert!(counts.0 > left.0 && counts.1 > 0, "{name}: {counts:?}");
            }
            run(&mut m, std::slice::from_ref(&input))
        });
        let scale = outputs[1].iter().fold(0f32, |m, x| m.max(x.abs()));
        for (a, b) in outputs[0].iter().zip(&outputs[1]) {
            assert!((a - b).abs() <= 1e-4 * scale, "{name}: {a} vs {b}");
        }
    }
}
