//! `grid_sampler_2d`: samples an `[N, C, H, W]` input at the points of an `[N, Hg, Wg,
//! 2]` grid of normalized `(x, y)` coordinates (-1 and 1 are the edges), giving `[N,
//! C, Hg, Wg]`.
//!
//! The arithmetic follows the official portable kernel (`op_grid_sampler_2d.cpp`,
//! `grid_sampler_2d_util.h`) step by step, in f32 for f32, f16 and bf16 inputs (upstream
//! rounds to f16/bf16 after each step of its nearest and bicubic modes) and f64 for
//! f64:
//!
//! * a coordinate is unnormalized to `((c + 1) / 2) (size - 1)` with `align_corners`,
//!   else `((c + 1) size - 1) / 2`; `border` padding clips it into `[0, size - 1]`,
//!   `reflection` reflects it about the edges (the pixel centers with
//!   `align_corners`, else half a pixel outside them) and clips it;
//! * `bilinear` (mode 0) weighs the four neighbours by the opposite rectangle's area,
//!   skipping those outside with `zeros` padding and clipping their indices otherwise;
//! * `nearest` (mode 1) rounds half-way coordinates to even;
//! * `bicubic` (mode 2) applies the cubic convolution (A = -0.75) to the 4 x 4
//!   neighbours of the unnormalized point, each read with the padding rule.
//!
//! Upstream also accepts integer inputs, computing in the integer type; here the
//! input must be floating point.

use etch_base::{Element, cast};

use crate::ops::elementwise::dtype::with_float;
use crate::ops::elementwise::num::Real;
use crate::ops::same_dtype;
use crate::ops::shape::common::require_contiguous;
use crate::schema::{OpArgs, OutArg, op_args};
use crate::{Args, KernelContext, KernelError, Registry, Tensor};

/// Registers this family's kernels.
pub fn register(r: &mut Registry) {
    r.register("aten::grid_sampler_2d.out", grid_sampler_2d);
}

op_args! {
    /// `grid_sampler_2d.out(Tensor input, Tensor grid, int interpolation_mode, int
    /// padding_mode, bool align_corners, *, Tensor(a!) out)`.
    struct GridSamplerArgs = "aten::grid_sampler_2d.out" {
        input: Tensor,
        grid: Tensor,
        interpolation_mode: i64,
        padding_mode: i64,
        align_corners: bool,
        out: OutArg,
    } returns 1
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Bilinear,
    Nearest,
    Bicubic,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

/// `std::max(a, b)`: `b` only when `a < b` (so a NaN `a` stays).
#[inline]
fn max_<A: PartialOrd>(a: A, b: A) -> A {
    if a < b { b } else { a }
}

/// `std::min(a, b)`: `b` only when `b < a`.
#[inline]
fn min_<A: PartialOrd>(a: A, b: A) -> A {
    if b < a { b } else { a }
}

/// The coordinate rules of one axis.
#[derive(Clone, Copy)]
struct Axis {
    size: i64,
    align: bool,
    padding: Padding,
}

impl Axis {
    fn unnormalize<A: Real>(&self, c: A) -> A {
        let two = A::of_i64(2);
        if self.align {
            ((c + A::ONE) / two) * A::of_i64(self.size - 1)
        } else {
            ((c + A::ONE) * A::of_i64(self.size) - A::ONE) / two
        }
    }

    fn clip<A: Real>(&self, c: A) -> A {
        min_(A::of_i64(self.size - 1), max_(c, A::ZERO))
    }

    fn clip_index(&self, i: i64) -> i64 {
        (self.size - 1).min(i.max(0))
    }

    /// Reflects `c` about the edges (the pixel centers with `align_corners`, else the
    /// outer pixel borders).
    fn reflect<A: Real>(&self, c: A) -> A {
        let (twice_low, twice_high) = if self.align {
            (0, 2 * (self.size - 1))
        } else {
            (-1, 2 * self.size - 1)
        };
        if twice_low == twice_high {
            return A::ZERO;
        }
        let two = A::of_i64(2);
        let min = A::of_i64(twice_low) / two;
        let span = A::of_i64(twice_high - twice_low) / two;
        let c = (c - min).abs();
        let extra = c % span;
        let flips = (c / span).floor().trunc_i64();
        if flips % 2 == 0 {
            extra + min
        } else {
            span - extra + min
        }
    }

    /// The source coordinate of grid value `c` for bilinear and nearest sampling.
    fn source<A: Real>(&self, c: A) -> A {
        let c = self.unnormalize(c);
        match self.padding {
            Padding::Zeros => c,
            Padding::Border => self.clip(c),
            Padding::Reflection => self.clip(self.reflect(c)),
        }
    }

    fn inside(&self, i: i64) -> bool {
        (0..self.size).contains(&i)
    }
}

/// The cubic convolution weights of the 4 taps around fraction `t`.
fn cubic_weights<A: Real>(t: A) -> [A; 4] {
    let a = A::from_f64(-0.75);
    let (two, three, four, five, eight) = (
        A::of_i64(2),
        A::of_i64(3),
        A::of_i64(4),
        A::of_i64(5),
        A::of_i64(8),
    );
    let near = |x: A| ((a + two) * x - (a + three)) * x * x + A::ONE;
    let far = |x: A| ((a * x - five * a) * x + eight * a) * x - four * a;
    let u = A::ONE - t;
    [far(t + A::ONE), near(t), near(u), far(u + A::ONE)]
}

fn cubic<A: Real>(p: [A; 4], t: A) -> A {
    let w = cubic_weights(t);
    p[0] * w[0] + p[1] * w[1] + p[2] * w[2] + p[3] * w[3]
}

/// One sampling pass: the planes of `input` and the grid.
struct Sampler<'a, E> {
    input: &'a [E],
    grid: &'a [E],
    mode: Mode,
    x: Axis,
    y: Axis,
}

impl<E: Element> Sampler<'_, E> {
    /// The value at `(iy, ix)` of the plane at `plane`.
    fn at<A: Real>(&self, plane: usize, iy: i64, ix: i64) -> A {
        cast::<E, A>(self.input[plane + (iy * self.x.size + ix) as usize])
    }

    /// The sample at grid point `(gx, gy)` of the plane starting at `plane`.
    fn sample<A: Real>(&self, plane: usize, gx: A, gy: A) -> A {
        let (x, y) = (self.x, self.y);
        match self.mode {
            Mode::Bilinear => {
                let (ix, iy) = (x.source(gx), y.source(gy));
                let (x0, y0) = (ix.floor().trunc_i64(), iy.floor().trunc_i64());
                // Saturating: an infinite grid value saturates the floor.
                let (x1, y1) = (x0.saturating_add(1), y0.saturating_add(1));
                let (fx0, fy0, fx1, fy1) =
                    (A::of_i64(x0), A::of_i64(y0), A::of_i64(x1), A::of_i64(y1));
                let corners = [
                    (y0, x0, (fx1 - ix) * (fy1 - iy)),
                    (y0, x1, (ix - fx0) * (fy1 - iy)),
                    (y1, x0, (fx1 - ix) * (iy - fy0)),
                    (y1, x1, (ix - fx0) * (iy - fy0)),
                ];
                if x.padding == Padding::Zeros {
                    let mut v = A::ZERO;
                    for (cy, cx, w) in corners {
                        if y.inside(cy) && x.inside(cx) {
                            v += self.at::<A>(plane, cy, cx) * w;
                        }
                    }
                    v
                } else {
                    let [a, b, c, d] = corners.map(|(cy, cx, w)| {
                        self.at::<A>(plane, y.clip_index(cy), x.clip_index(cx)) * w
                    });
                    a + b + c + d
                }
            }
            Mode::Nearest => {
                let ix = x.source(gx).round_ties_even().trunc_i64();
                let iy = y.source(gy).round_ties_even().trunc_i64();
                if x.padding == Padding::Zeros {
                    if y.inside(iy) && x.inside(ix) {
                        self.at(plane, iy, ix)
                    } else {
                        A::ZERO
                    }
                } else {
                    self.at(plane, y.clip_index(iy), x.clip_index(ix))
                }
            }
            Mode::Bicubic => {
                let (ix, iy) = (x.unnormalize(gx), y.unnormalize(gy));
                let (x0, y0) = (ix.floor().trunc_i64(), iy.floor().trunc_i64());
                let (tx, ty) = (ix - A::of_i64(x0), iy - A::of_i64(y0));
                let tap = |cy: i64, cx: i64| -> A { self.bounded(plane, cy, cx) };
                let rows = [-1i64, 0, 1, 2].map(|dy| {
                    let r = [-1i64, 0, 1, 2]
                        .map(|dx| tap(y0.saturating_add(dy), x0.saturating_add(dx)));
                    cubic(r, tx)
                });
                cubic(rows, ty)
            }
        }
    }

    /// A bicubic tap read with the padding rule.
    fn bounded<A: Real>(&self, plane: usize, iy: i64, ix: i64) -> A {
        let (x, y) = (self.x, self.y);
        match x.padding {
            Padding::Zeros => {
                if y.inside(iy) && x.inside(ix) {
                    self.at(plane, iy, ix)
                } else {
                    A::ZERO
                }
            }
            Padding::Border => self.at(plane, y.clip_index(iy), x.clip_index(ix)),
            Padding::Reflection => {
                let ry = y.clip(y.reflect(A::of_i64(iy))).trunc_i64();
                let rx = x.clip(x.reflect(A::of_i64(ix))).trunc_i64();
                self.at(plane, ry, rx)
            }
        }
    }
}

/// As upstream: a 4-d input (contiguous dim order) and grid, the grid's last dim 2,
/// equal batches, one dtype for input, grid and out; modes 0 to 2 and paddings 0 to
/// 2. The input's planes must not be empty when the grid is not.
fn grid_sampler_2d(ctx: &KernelContext<'_>, a: &mut Args<'_>) -> Result<(), KernelError> {
    let GridSamplerArgs {
        input,
        grid,
        interpolation_mode,
        padding_mode,
        align_corners,
        out,
    } = GridSamplerArgs::unpack(a)?;
    if input.rank() != 4 || grid.rank() != 4 || grid.sizes()[3] != 2 {
        return Err(KernelError::invalid(format!(
            "grid_sampler_2d needs a 4-d input and an [N, H, W, 2] grid, got {:?} and {:?}",
            input.sizes(),
            grid.sizes()
        )));
    }
    let [n, c, h, w] = [0, 1, 2, 3].map(|d| input.sizes()[d]);
    let (gh, gw) = (grid.sizes()[1], grid.sizes()[2]);
    if grid.sizes()[0] != n {
        return Err(KernelError::invalid(format!(
            "grid_sampler_2d: input batch {n} and grid batch {} differ",
            grid.sizes()[0]
        )));
    }
    same_dtype(&input, &grid)?;
    same_dtype(&input, &out.tensor())?;
    let mode = match interpolation_mode {
        0 => Mode::Bilinear,
        1 => Mode::Nearest,
        2 => Mode::Bicubic,
        m => {
            return Err(KernelError::invalid(format!(
                "grid_sampler_2d: interpolation_mode {m} is not 0, 1 or 2"
            )));
        }
    };
    let padding = match padding_mode {
        0 => Padding::Zeros,
        1 => Padding::Border,
        2 => Padding::Reflection,
        p => {
            return Err(KernelError::invalid(format!(
                "grid_sampler_2d: padding_mode {p} is not 0, 1 or 2"
            )));
        }
    };
    for (t, what) in [(&input, "input"), (&grid, "grid"), (&out.tensor(), "out")] {
        require_contiguous(t, what)?;
    }
    let out = out.resize(a, &[n, c, gh, gw])?;
    if out.numel() == 0 {
        return Ok(());
    }
    if h == 0 || w == 0 {
        return Err(KernelError::invalid(
            "grid_sampler_2d: cannot sample an input with empty planes",
        ));
    }
    let axis = |size: usize| Axis {
        size: size as i64,
        align: align_corners,
        padding,
    };
    with_float!(input.dtype(), "grid_sampler_2d", E, A => {
        let s = Sampler {
            input: ctx.read::<E>(&input)?,
            grid: ctx.read::<E>(&grid)?,
            mode,
            x: axis(w),
            y: axis(h),
        };
        let o = ctx.write::<E>(&out)?;
        let points = gh * gw;
        for b in 0..n {
            for ch in 0..c {
                let plane = (b * c + ch) * h * w;
                let dst = &mut o[(b * c + ch) * points..][..points];
                for (p, d) in dst.iter_mut().enumerate() {
                    let g = (b * points + p) * 2;
                    let (gx, gy) = (cast::<E, A>(s.grid[g]), cast::<E, A>(s.grid[g + 1]));
                    *d = cast::<A, E>(s.sample::<A>(plane, gx, gy));
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use etch_base::ScalarType;

    use super::{Axis, Padding, cubic_weights};
    use crate::testing::Harness;

    fn run(
        input: &[f32],
        hw: (usize, usize),
        grid: &[f32],
        mode: i64,
        pad: i64,
        align: bool,
    ) -> Vec<f32> {
        let mut h = Harness::new();
        let x = h.tensor(&[1, 1, hw.0, hw.1], input);
        let points = grid.len() / 2;
        let g = h.tensor(&[1, 1, points, 2], grid);
        let (m, p, al) = (h.int(mode), h.int(pad), h.bool(align));
        let out = h.out(ScalarType::Float, &[1, 1, 1, points]);
        h.call("aten::grid_sampler_2d.out", &[x, g, m, p, al, out, out])
            .unwrap();
        h.read::<f32>(out)
    }

    #[test]
    fn corners_and_centers_land_on_pixels() {
        // A 2 x 3 image; with align_corners the grid's -1 and 1 are pixel centers.
        let img = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let grid = [-1.0f32, -1.0, 1.0, 1.0, 0.0, -1.0, 1.0, -1.0];
        for mode in [0, 1, 2] {
            for pad in [0, 1, 2] {
                let got = run(&img, (2, 3), &grid, mode, pad, true);
                let want = [1.0, 6.0, 2.0, 3.0];
                for (g, w) in got.iter().zip(want) {
                    assert!((g - w).abs() < 1e-5, "mode {mode} pad {pad}: {got:?}");
                }
            }
        }
        // Bilinear halfway between the two rows of the middle column.
        assert_eq!(run(&img, (2, 3), &[0.0, 0.0], 0, 0, true), vec![3.5]);
        // Without align_corners, -1 is the outer border: half the corner pixel with zeros
        // padding in x and y (a quarter of the weight), the pixel itself with border.
        assert_eq!(run(&img, (2, 3), &[-1.0, -1.0], 0, 0, false), vec![0.25]);
        assert_eq!(run(&img, (2, 3), &[-1.0, -1.0], 0, 1, false), vec![1.0]);
        // Outside with zeros padding: 0 for nearest.
        assert_eq!(run(&img, (2, 3), &[3.0, 0.0], 1, 0, false), vec![0.0]);
        // Infinite and NaN grid values sample something or nothing, without failing.
        let odd = [f32::INFINITY, 0.0, f32::NEG_INFINITY, f32::NAN];
        for mode in [0, 1, 2] {
            for pad in [0, 1, 2] {
                for align in [false, true] {
                    assert_eq!(run(&img, (2, 3), &odd, mode, pad, align).len(), 2);
                }
            }
        }
    }

    #[test]
    fn reflection_and_cubic_weights() {
        let ax = Axis {
            size: 4,
            align: true,
            padding: Padding::Reflection,
        };
        // Reflected about 0 and 3.
        assert_eq!(ax.reflect(-1.0f64), 1.0);
        assert_eq!(ax.reflect(4.5f64), 1.5);
        assert_eq!(ax.reflect(7.0f64), 1.0);
        let ax = Axis { align: false, ..ax };
        // Reflected about -0.5 and 3.5.
        assert_eq!(ax.reflect(-1.0f64), 0.0);
        assert_eq!(ax.reflect(4.0f64), 3.0);
        // The cubic weights sum to 1 and reproduce the sample at t = 0.
        for t in [0.0f64, 0.25, 0.5, 0.9] {
            let w = cubic_weights(t);
            assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
        assert_eq!(cubic_weights(0.0f64), [0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn bad_arguments_are_refused() {
        let mut h = Harness::new();
        let x = h.tensor(&[1, 1, 2, 2], &[1.0f32; 4]);
        let g = h.tensor(&[1, 1, 1, 2], &[0.0f32; 2]);
        let g3 = h.tensor(&[1, 1, 1, 3], &[0.0f32; 3]);
        let gb = h.tensor(&[2, 1, 1, 2], &[0.0f32; 4]);
        let xi = h.tensor(&[1, 1, 2, 2], &[1i32; 4]);
        let gi = h.tensor(&[1, 1, 1, 2], &[0i32; 2]);
        let (zero, three, f) = (h.int(0), h.int(3), h.bool(false));
        let out = h.out(ScalarType::Float, &[1, 1, 1, 1]);
        let op = "aten::grid_sampler_2d.out";
        for args in [
            [x, g, three, zero, f, out, out],
            [x, g, zero, three, f, out, out],
            [x, g3, zero, zero, f, out, out],
            [x, gb, zero, zero, f, out, out],
            [xi, gi, zero, zero, f, out, out],
        ] {
            assert!(h.call(op, &args).is_err());
        }
        h.call(op, &[x, g, zero, zero, f, out, out]).unwrap();
        assert_eq!(h.read::<f32>(out), vec![1.0]);
    }
}
