//! Matrix products: `linear`, `mm`, `addmm`, `bmm` and `matmul`.
//!
//! f32, f16 and bf16 run on the packed GEMM of [`gemm`] (f32 accumulation, one
//! rounding into the output type); one-row products (decode) take its parallel
//! dot-product path. f64 runs plain loops. As in PyTorch every operand must have the
//! output's dtype.

use etch_base::ScalarType;

use super::same_dtype;
use crate::ops::elementwise::broadcast::broadcast_shapes;
use crate::ops::shape::common::{MAX_DIMS, broadcast_strides, require_contiguous, strided_offset};
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{
    Args, Batch, Batched, KernelContext, KernelError, MAX_RANK, Registry, Scalar, Tensor, unpaired,
};
use etch_linalg::gemm::{self, Elems, Gemm, MatRef};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::linear.out", linear);
    r.register_batched("aten::linear.out", |c, a| batched_rows(c, a, linear_row));
    r.register_batched("aten::mm.out", |c, a| batched_rows(c, a, mm_row));
    r.register_batched("aten::addmm.out", |c, a| batched_rows(c, a, addmm_row));
    r.register_batched("aten::bmm.out", bmm_batched);
    r.register("aten::mm.out", |c, a| matrix_product(c, a, false));
    r.register("aten::addmm.out", addmm);
    r.register("aten::bmm.out", |c, a| matrix_product(c, a, true));
    r.register("aten::matmul.out", matmul);
}

/// The elements of a float tensor.
fn elems<'a>(ctx: &'a KernelContext<'_>, t: &Tensor) -> Result<Elems<'a>, KernelError> {
    require_contiguous(t, "matmul operand")?;
    match t.dtype() {
        ScalarType::Float => Ok(Elems::F32(ctx.read(t)?)),
        ScalarType::Half => Ok(Elems::F16(ctx.read(t)?)),
        ScalarType::BFloat16 => Ok(Elems::BF16(ctx.read(t)?)),
        ScalarType::Double => Ok(Elems::F64(ctx.read(t)?)),
        dtype => Err(KernelError::UnsupportedDtype {
            dtype,
            what: "matrix product (f32, f16, bf16 or f64)",
        }),
    }
}

/// A view of `data` from element `offset`: `rows x cols`, row stride `rs`, column
/// stride `cs` (a row-major matrix has `rs = cols`, `cs = 1`).
pub(crate) fn view(
    data: Elems<'_>,
    offset: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
) -> MatRef<'_> {
    MatRef {
        data,
        offset,
        rows,
        cols,
        rs,
        cs,
    }
}

/// The plain product `a · b`: no scaling, addend or clamp.
pub(crate) fn product<'a>(a: MatRef<'a>, b: MatRef<'a>) -> Gemm<'a> {
    Gemm {
        a,
        b,
        alpha: 1.0,
        addend: None,
        clamp: None,
    }
}

/// Runs `count` products, product `i` being `make(i)`, into consecutive `m x n`
/// blocks of `out`, with `alpha`/`beta` scaling.
#[allow(clippy::too_many_arguments)]
fn run_products<'a>(
    ctx: &'a KernelContext<'_>,
    out: &Tensor,
    count: usize,
    m: usize,
    n: usize,
    alpha: f64,
    beta: f64,
    make: impl Fn(usize) -> Gemm<'a>,
) -> Result<(), KernelError> {
    require_contiguous(out, "out")?;
    let block = m * n;
    if count == 0 || block == 0 {
        return Ok(());
    }
    if out.numel() < count * block {
        return Err(KernelError::invalid("matmul out tensor too small"));
    }
    let isa = etch_linalg::dispatch().gemm;
    let pool = ctx.pool();
    macro_rules! run_as {
        ($t:ty) => {{
            let o = ctx.write::<$t>(out)?;
            let need = gemm::scratch_len(isa, &make(0), pool.threads());
            let scratch = ctx.scratch_dirty::<f32>(need)?;
            for (i, blk) in o.chunks_exact_mut(block).take(count).enumerate() {
                gemm::gemm(pool, isa, &make(i), blk, scratch)?;
            }
            Ok(())
        }};
    }
    match out.dtype() {
        ScalarType::Float => run_as!(f32),
        ScalarType::Half => run_as!(half::f16),
        ScalarType::BFloat16 => run_as!(half::bf16),
        ScalarType::Double => {
            let o = ctx.write::<f64>(out)?;
            for (i, blk) in o.chunks_exact_mut(block).take(count).enumerate() {
                gemm::gemm_f64(&make(i), alpha, beta, blk)?;
            }
            Ok(())
        }
        dtype => Err(KernelError::UnsupportedDtype {
            dtype,
            what: "matrix product (f32, f16, bf16 or f64)",
        }),
    }
}

op_args! {
    /// `linear.out(Tensor input, Tensor weight, Tensor? bias=None, *, Tensor(a!) out)`:
    /// `out[..., n] = Σ_k input[..., k] · weight[n, k] + bias[n]`.
    struct LinearArgs = "aten::linear.out" {
        input: Tensor,
        weight: Tensor,
        bias: Option<Tensor>,
        out: OutArg,
    } returns 1
}

fn linear(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let LinearArgs {
        input,
        weight,
        bias,
        out,
    } = LinearArgs::unpack(a)?;
    same_dtype(&input, &weight)?;
    same_dtype(&input, &out.tensor())?;
    if let Some(b) = &bias {
        same_dtype(&input, b)?;
    }
    let rank = input.rank();
    if rank == 0 || weight.rank() != 2 {
        return Err(KernelError::invalid(format!(
            "linear expects input [..., K] and weight [N, K], got {:?} and {:?}",
            input.sizes(),
            weight.sizes()
        )));
    }
    let k = input.sizes()[rank - 1];
    let (n, wk) = (weight.sizes()[0], weight.sizes()[1]);
    if wk != k {
        return Err(KernelError::invalid(format!(
            "linear: input has {k} features but weight is {n}x{wk}"
        )));
    }
    let bias_cs = match &bias {
        None => 0,
        Some(b) if b.rank() <= 1 && b.numel() == n => 1,
        Some(b) if b.numel() == 1 && b.rank() <= 1 => 0,
        Some(b) => {
            return Err(KernelError::invalid(format!(
                "linear bias of shape {:?} for {n} outputs",
                b.sizes()
            )));
        }
    };
    let m: usize = input.sizes()[..rank - 1].iter().product();
    let mut sizes = [0usize; MAX_RANK];
    sizes[..rank - 1].copy_from_slice(&input.sizes()[..rank - 1]);
    sizes[rank - 1] = n;
    let out = out.resize(a, &sizes[..rank])?;
    let x = elems(ctx, &input)?;
    let w = elems(ctx, &weight)?;
    let b = match &bias {
        Some(t) => Some(elems(ctx, t)?),
        None => None,
    };
    let g = Gemm {
        a: view(x, 0, m, k, k, 1),
        b: view(w, 0, k, n, 1, k),
        alpha: 1.0,
        addend: b.map(|d| (view(d, 0, m, n, 0, bias_cs), 1.0)),
        clamp: None,
    };
    run_products(ctx, &out, 1, m, n, 1.0, 1.0, |_| g)
}

/// One session's one-row f32 product against weights the sessions may share: what
/// the batched forms of `linear`, `mm` and `addmm` compute with.
struct RowProduct {
    x: Tensor,
    /// `[n, k]` when `nk` (a linear weight), else `[k, n]`.
    w: Tensor,
    nk: bool,
    /// Added to every row (`n` values, or one broadcast), scaled by `beta`.
    addend: Option<Tensor>,
    alpha: f32,
    beta: f32,
    out: OutArg,
    out_sizes: [usize; MAX_RANK],
    out_rank: usize,
    k: usize,
    n: usize,
}

impl RowProduct {
    fn f32s(&self) -> bool {
        [
            Some(&self.x),
            Some(&self.w),
            self.addend.as_ref(),
            Some(&self.out.tensor()),
        ]
        .into_iter()
        .flatten()
        .all(|t| t.dtype() == ScalarType::Float)
    }

    /// The addend's column step: 1 for a row of `n`, 0 for one broadcast value.
    fn addend_step(&self) -> Option<usize> {
        match &self.addend {
            None => Some(0),
            Some(c) if c.numel() == self.n && c.sizes().iter().rev().skip(1).all(|&d| d == 1) => {
                Some(1)
            }
            Some(c) if c.numel() == 1 => Some(0),
            Some(_) => None,
        }
    }
}

/// `linear` of one row: `x[.., k] · w[n, k] + bias`.
fn linear_row(a: &mut Args<'_>) -> Result<Option<RowProduct>, KernelError> {
    let l = LinearArgs::unpack(a)?;
    let (rank, wr) = (l.input.rank(), l.weight.rank());
    if rank == 0 || wr != 2 || l.input.numel() != l.input.sizes()[rank - 1] {
        return Ok(None);
    }
    let (n, k) = (l.weight.sizes()[0], l.weight.sizes()[1]);
    let mut out_sizes = [0usize; MAX_RANK];
    out_sizes[..rank].copy_from_slice(l.input.sizes());
    out_sizes[rank - 1] = n;
    Ok(Some(RowProduct {
        x: l.input,
        w: l.weight,
        nk: true,
        addend: l.bias,
        alpha: 1.0,
        beta: 1.0,
        out: l.out,
        out_sizes,
        out_rank: rank,
        k,
        n,
    }))
}

/// `mm` of one row: `x[1, k] · w[k, n]`.
fn mm_row(a: &mut Args<'_>) -> Result<Option<RowProduct>, KernelError> {
    let p = MatrixProductArgs::unpack(a)?;
    if p.input.rank() != 2 || p.mat2.rank() != 2 || p.input.sizes()[0] != 1 {
        return Ok(None);
    }
    let (k, n) = (p.mat2.sizes()[0], p.mat2.sizes()[1]);
    let mut out_sizes = [0usize; MAX_RANK];
    out_sizes[..2].copy_from_slice(&[1, n]);
    Ok(Some(RowProduct {
        x: p.input,
        w: p.mat2,
        nk: false,
        addend: None,
        alpha: 1.0,
        beta: 0.0,
        out: p.out,
        out_sizes,
        out_rank: 2,
        k,
        n,
    }))
}

/// `addmm` of one row: `beta · c + alpha · x[1, k] · w[k, n]`.
fn addmm_row(a: &mut Args<'_>) -> Result<Option<RowProduct>, KernelError> {
    let p = AddmmArgs::unpack(a)?;
    if p.mat1.rank() != 2 || p.mat2.rank() != 2 || p.mat1.sizes()[0] != 1 || p.input.rank() > 2 {
        return Ok(None);
    }
    let (k, n) = (p.mat2.sizes()[0], p.mat2.sizes()[1]);
    let mut out_sizes = [0usize; MAX_RANK];
    out_sizes[..2].copy_from_slice(&[1, n]);
    Ok(Some(RowProduct {
        x: p.mat1,
        w: p.mat2,
        nk: false,
        addend: Some(p.input),
        alpha: scalar_f64(p.alpha) as f32,
        beta: scalar_f64(p.beta) as f32,
        out: p.out,
        out_sizes,
        out_rank: 2,
        k,
        n,
    }))
}

/// The batched form of a one-row product op (`describe` reads one session's
/// arguments): when every session has one f32 row and reads the same weight and
/// addend bytes (constants of the program they share) with the same scalars, the rows
/// run in one pass over the weight, each computed as the op computes it alone
/// (`gemm::gemm_rows_alone`); else [`Batched::PerSession`].
fn batched_rows(
    ctxs: &Batch<KernelContext<'_>>,
    args: &mut Batch<Args<'_>>,
    describe: fn(&mut Args<'_>) -> Result<Option<RowProduct>, KernelError>,
) -> Result<Batched, KernelError> {
    let (Some(ctx0), Some(first)) = (ctxs.get(0), args.get_mut(0)) else {
        return Ok(Batched::PerSession);
    };
    let Some(p0) = describe(first)? else {
        return Ok(Batched::PerSession);
    };
    let Some(step) = p0.addend_step() else {
        return Ok(Batched::PerSession);
    };
    if !p0.f32s() || p0.w.rank() != 2 {
        return Ok(Batched::PerSession);
    }
    let (k, n) = (p0.k, p0.n);
    let w = ctx0.read::<f32>(&p0.w)?;
    let c = p0
        .addend
        .as_ref()
        .map(|t| ctx0.read::<f32>(t))
        .transpose()?;
    let same = |a: &[f32], b: &[f32]| std::ptr::eq(a, b);
    for (i, a) in args.iter_mut().enumerate() {
        let ctx = ctxs.get(i).ok_or_else(unpaired)?;
        let Some(p) = describe(a)? else {
            return Ok(Batched::PerSession);
        };
        let same_addend = match (&p.addend, c) {
            (None, None) => true,
            (Some(t), Some(c)) => same(ctx.read::<f32>(t)?, c),
            _ => false,
        };
        let same_shape = (p.k, p.n, p.nk, p.alpha, p.beta) == (k, n, p0.nk, p0.alpha, p0.beta);
        if !p.f32s()
            || !same_shape
            || p.x.numel() != k
            || !same(ctx.read::<f32>(&p.w)?, w)
            || !same_addend
        {
            return Ok(Batched::PerSession);
        }
    }
    let sessions = args.len();
    let isa = etch_linalg::dispatch().gemm;
    let pool = ctx0.pool();
    let xs = ctx0.scratch_dirty::<f32>(sessions * k)?;
    for (i, (a, x)) in args.iter_mut().zip(xs.chunks_exact_mut(k)).enumerate() {
        let ctx = ctxs.get(i).ok_or_else(unpaired)?;
        let p = describe(a)?.ok_or_else(too_short)?;
        x.copy_from_slice(ctx.read::<f32>(&p.x)?.get(..k).ok_or_else(too_short)?);
    }
    let (rs, cs) = if p0.nk { (1, k) } else { (n, 1) };
    let g = Gemm {
        a: view(Elems::F32(xs), 0, sessions, k, k, 1),
        b: view(Elems::F32(w), 0, k, n, rs, cs),
        alpha: p0.alpha,
        addend: c.map(|c| (view(Elems::F32(c), 0, sessions, n, 0, step), p0.beta)),
        clamp: None,
    };
    let ys = ctx0.scratch_dirty::<f32>(sessions * n)?;
    let scratch =
        ctx0.scratch_dirty::<f32>(gemm::rows_alone_scratch_len(isa, &g, pool.threads()))?;
    gemm::gemm_rows_alone(pool, isa, &g, ys, scratch)?;
    for (i, (a, y)) in args.iter_mut().zip(ys.chunks_exact(n)).enumerate() {
        let ctx = ctxs.get(i).ok_or_else(unpaired)?;
        let p = describe(a)?.ok_or_else(too_short)?;
        let out = p.out.resize(a, &p.out_sizes[..p.out_rank])?;
        require_contiguous(&out, "out")?;
        ctx.write::<f32>(&out)?
            .get_mut(..n)
            .ok_or_else(too_short)?
            .copy_from_slice(y);
    }
    Ok(Batched::Done)
}

fn too_short() -> KernelError {
    KernelError::invalid("batched product: a tensor is shorter than its shape")
}
/// `bmm` for several sessions: when every session has one f32 row per batch
/// (`[b, 1, k]`) against the same constant `[b, k, n]` bytes, each batch's rows of all
/// sessions run in one pass over that batch of the weight, each computed as `bmm`
/// computes it alone (`gemm::gemm_rows_alone`); else [`Batched::PerSession`].
fn bmm_batched(
    ctxs: &Batch<KernelContext<'_>>,
    args: &mut Batch<Args<'_>>,
) -> Result<Batched, KernelError> {
    let (Some(ctx0), Some(first)) = (ctxs.get(0), args.get_mut(0)) else {
        return Ok(Batched::PerSession);
    };
    let p0 = MatrixProductArgs::unpack(first)?;
    let dims = |x: &Tensor, y: &Tensor| -> Option<(usize, usize, usize)> {
        let f32s = x.dtype() == ScalarType::Float && y.dtype() == ScalarType::Float;
        let (xs, ys) = (x.sizes(), y.sizes());
        (f32s && xs.len() == 3 && ys.len() == 3 && xs[1] == 1 && xs[0] == ys[0] && xs[2] == ys[1])
            .then(|| (xs[0], xs[2], ys[2]))
    };
    let Some((batches, k, n)) = dims(&p0.input, &p0.mat2) else {
        return Ok(Batched::PerSession);
    };
    let w = ctx0.read::<f32>(&p0.mat2)?;
    for (i, a) in args.iter_mut().enumerate() {
        let ctx = ctxs.get(i).ok_or_else(unpaired)?;
        let p = MatrixProductArgs::unpack(a)?;
        if dims(&p.input, &p.mat2) != Some((batches, k, n))
            || p.out.tensor().dtype() != ScalarType::Float
            || !std::ptr::eq(ctx.read::<f32>(&p.mat2)?, w)
        {
            return Ok(Batched::PerSession);
        }
    }
    let sessions = args.len();
    let isa = etch_linalg::dispatch().gemm;
    let pool = ctx0.pool();
    // Each session's rows and outputs, taken once (a tensor is borrowed once per call).
    let mut rows: Batch<&[f32]> = Batch::new();
    let mut outs: Batch<&mut [f32]> = Batch::new();
    for (i, a) in args.iter_mut().enumerate() {
        let ctx = ctxs.get(i).ok_or_else(unpaired)?;
        let p = MatrixProductArgs::unpack(a)?;
        let out = p.out.resize(a, &[batches, 1, n])?;
        require_contiguous(&out, "out")?;
        let x = ctx
            .read::<f32>(&p.input)?
            .get(..batches * k)
            .ok_or_else(too_short)?;
        let y = ctx
            .write::<f32>(&out)?
            .get_mut(..batches * n)
            .ok_or_else(too_short)?;
        if rows.push(x).is_err() || outs.push(y).is_err() {
            return Err(unpaired());
        }
    }
    let xs = ctx0.scratch_dirty::<f32>(sessions * k)?;
    let ys = ctx0.scratch_dirty::<f32>(sessions * n)?;
    fn problem<'a>(
        xs: &'a [f32],
        w: &'a [f32],
        (bi, rows, k, n): (usize, usize, usize, usize),
    ) -> Result<Gemm<'a>, KernelError> {
        let wb = w.get(bi * k * n..).ok_or_else(too_short)?;
        Ok(product(
            view(Elems::F32(xs), 0, rows, k, k, 1),
            view(Elems::F32(wb), 0, k, n, n, 1),
        ))
    }
    let need =
        gemm::rows_alone_scratch_len(isa, &problem(xs, w, (0, sessions, k, n))?, pool.threads());
    let scratch = ctx0.scratch_dirty::<f32>(need)?;
    for bi in 0..batches {
        for (x, row) in xs.chunks_exact_mut(k).zip(rows.iter()) {
            x.copy_from_slice(&row[bi * k..(bi + 1) * k]);
        }
        gemm::gemm_rows_alone(
            pool,
            isa,
            &problem(xs, w, (bi, sessions, k, n))?,
            ys,
            scratch,
        )?;
        for (y, out) in ys.chunks_exact(n).zip(outs.iter_mut()) {
            out[bi * n..(bi + 1) * n].copy_from_slice(y);
        }
    }
    Ok(Batched::Done)
}

/// Checks a 2-d operand and returns its sizes.
fn matrix(t: &Tensor, what: &str) -> Result<(usize, usize), KernelError> {
    if t.rank() != 2 {
        return Err(KernelError::invalid(format!(
            "{what} must be 2-d, got {:?}",
            t.sizes()
        )));
    }
    Ok((t.sizes()[0], t.sizes()[1]))
}

op_args! {
    /// `op.out(Tensor self, Tensor mat2, *, Tensor(a!) out)` (`mm`, `bmm`).
    struct MatrixProductArgs = "aten::<mm|bmm>.out" {
        input: Tensor,
        mat2: Tensor,
        out: OutArg,
    } returns 1
}

/// `mm` (`[m, k] · [k, n]`, `batched` false) and `bmm` (`[b, m, k] · [b, k, n]`).
fn matrix_product(
    ctx: &KernelContext<'_>,
    a: &mut Args<'_>,
    batched: bool,
) -> Result<(), KernelError> {
    let MatrixProductArgs {
        input: x,
        mat2: y,
        out,
    } = MatrixProductArgs::unpack(a)?;
    same_dtype(&x, &y)?;
    same_dtype(&x, &out.tensor())?;
    let (batch, m, k, n) = if batched {
        bmm_dims(&x, &y)?
    } else {
        mm_dims(&x, &y)?
    };
    let sizes = [batch, m, n];
    let out = out.resize(a, if batched { &sizes } else { &sizes[1..] })?;
    let (xd, yd) = (elems(ctx, &x)?, elems(ctx, &y)?);
    run_products(ctx, &out, batch, m, n, 1.0, 0.0, |i| {
        product(
            view(xd, i * m * k, m, k, k, 1),
            view(yd, i * k * n, k, n, n, 1),
        )
    })
}

/// `(1, m, k, n)` of `mm`'s `[m, k]` and `[k, n]` operands.
fn mm_dims(x: &Tensor, y: &Tensor) -> Result<(usize, usize, usize, usize), KernelError> {
    let (m, k) = matrix(x, "mm self")?;
    let (k2, n) = matrix(y, "mm mat2")?;
    if k != k2 {
        return Err(KernelError::invalid(format!("mm of {m}x{k} and {k2}x{n}")));
    }
    Ok((1, m, k, n))
}

/// `(b, m, k, n)` of `bmm`'s `[b, m, k]` and `[b, k, n]` operands.
fn bmm_dims(x: &Tensor, y: &Tensor) -> Result<(usize, usize, usize, usize), KernelError> {
    if x.rank() != 3 || y.rank() != 3 {
        return Err(KernelError::invalid(format!(
            "bmm expects 3-d operands, got {:?} and {:?}",
            x.sizes(),
            y.sizes()
        )));
    }
    let (bx, m, k) = (x.sizes()[0], x.sizes()[1], x.sizes()[2]);
    let (by, k2, n) = (y.sizes()[0], y.sizes()[1], y.sizes()[2]);
    if bx != by || k != k2 {
        return Err(KernelError::invalid(format!(
            "bmm of {:?} and {:?}",
            x.sizes(),
            y.sizes()
        )));
    }
    Ok((bx, m, k, n))
}

/// A scalar argument as f64 (ints and bools convert).
fn scalar_f64(s: Scalar) -> f64 {
    s.to_f64()
}

op_args! {
    /// `addmm.out(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1,
    /// Scalar alpha=1, Tensor(a!) out)`: `beta * self + alpha * mat1 · mat2`, `self`
    /// broadcast.
    struct AddmmArgs = "aten::addmm.out" {
        input: Tensor,
        mat1: Tensor,
        mat2: Tensor,
        beta: Scalar,
        alpha: Scalar,
        out: OutArg,
    } returns 1
}

fn addmm(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let AddmmArgs {
        input: c,
        mat1: x,
        mat2: y,
        beta,
        alpha,
        out,
    } = AddmmArgs::unpack(a)?;
    let beta = scalar_f64(beta);
    let alpha = scalar_f64(alpha);
    same_dtype(&x, &y)?;
    same_dtype(&x, &c)?;
    same_dtype(&x, &out.tensor())?;
    let (m, k) = matrix(&x, "addmm mat1")?;
    let (k2, n) = matrix(&y, "addmm mat2")?;
    if k != k2 {
        return Err(KernelError::invalid(format!(
            "addmm of {m}x{k} and {k2}x{n}"
        )));
    }
    if c.rank() > 2 {
        return Err(KernelError::invalid("addmm self must have at most 2 dims"));
    }
    let mut sb = [0usize; MAX_DIMS];
    let cs = broadcast_strides(c.sizes(), c.strides(), &[m, n], &mut sb)?;
    let (crs, ccs) = (cs[0], cs[1]);
    let out = out.resize(a, &[m, n])?;
    let (xd, yd, cd) = (elems(ctx, &x)?, elems(ctx, &y)?, elems(ctx, &c)?);
    let g = Gemm {
        a: view(xd, 0, m, k, k, 1),
        b: view(yd, 0, k, n, n, 1),
        alpha: alpha as f32,
        addend: Some((view(cd, 0, m, n, crs, ccs), beta as f32)),
        clamp: None,
    };
    run_products(ctx, &out, 1, m, n, alpha, beta, |_| g)
}

op_args! {
    /// `matmul.out(Tensor self, Tensor other, *, Tensor(a!) out)`: `torch.matmul`, with
    /// 1-d operands promoted and batch dims broadcast.
    struct MatmulArgs = "aten::matmul.out" {
        input: Tensor,
        other: Tensor,
        out: OutArg,
    } returns 1
}

fn matmul(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let MatmulArgs {
        input: x,
        other: y,
        out,
    } = MatmulArgs::unpack(a)?;
    same_dtype(&x, &y)?;
    same_dtype(&x, &out.tensor())?;
    let (xr, yr) = (x.rank(), y.rank());
    if xr == 0 || yr == 0 {
        return Err(KernelError::invalid("matmul of a 0-d tensor"));
    }
    // x as [batch.., m, k] and y as [batch.., k, n]; 1-d operands give m or n of 1.
    let (m, k, xrs) = if xr == 1 {
        (1, x.sizes()[0], 0)
    } else {
        (x.sizes()[xr - 2], x.sizes()[xr - 1], x.strides()[xr - 2])
    };
    let (k2, n, ycs, yrs) = if yr == 1 {
        (y.sizes()[0], 1, 0, 1)
    } else {
        (y.sizes()[yr - 2], y.sizes()[yr - 1], 1, y.strides()[yr - 2])
    };
    if k != k2 {
        return Err(KernelError::invalid(format!(
            "matmul of {:?} and {:?}",
            x.sizes(),
            y.sizes()
        )));
    }
    let xb = &x.sizes()[..xr.saturating_sub(2)];
    let yb = &y.sizes()[..yr.saturating_sub(2)];
    let mut bbuf = [0usize; MAX_RANK];
    let batch = broadcast_shapes(&[xb, yb], &mut bbuf)?;
    let mut xs = [0usize; MAX_DIMS];
    let xbs = broadcast_strides(xb, &x.strides()[..xb.len()], batch, &mut xs)?;
    let mut ys = [0usize; MAX_DIMS];
    let ybs = broadcast_strides(yb, &y.strides()[..yb.len()], batch, &mut ys)?;
    let mut sizes = [0usize; MAX_RANK];
    let mut r = batch.len();
    sizes[..r].copy_from_slice(batch);
    if xr >= 2 {
        sizes[r] = m;
        r += 1;
    }
    if yr >= 2 {
        sizes[r] = n;
        r += 1;
    }
    if r > MAX_RANK {
        return Err(KernelError::invalid("matmul result exceeds the rank limit"));
    }
    let count: usize = batch.iter().product();
    let out = out.resize(a, &sizes[..r])?;
    let (xd, yd) = (elems(ctx, &x)?, elems(ctx, &y)?);
    run_products(ctx, &out, count, m, n, 1.0, 0.0, |i| {
        product(
            view(xd, strided_offset(i, batch, xbs), m, k, xrs, 1),
            view(yd, strided_offset(i, batch, ybs), k, n, yrs, ycs),
        )
    })
}

#[cfg(test)]
mod tests;
