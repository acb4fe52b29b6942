//! XNNPACK's fixed-point arithmetic of the int8 binary nodes: the parameters of `Add`
//! and `Multiply` on qint8 tensors as operator creation derives them, and one element
//! of each.

use etch_linalg::quant::qs8::requantize;

use crate::nodes::quantized::TensorQuant;

/// `Add` of two qint8 tensors: XNNPACK's fixed-point form
/// (google/XNNPACK `src/microparams-init.c` `xnn_init_qs8_add_minmax_scalar_params`,
/// `src/xnnpack/requantization.h` `xnn_qs8_quantize_add`):
/// `y = clamp(((bias + a·ma + b·mb) >> shift) + zp)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Int8AddParams {
    pub a_multiplier: i32,
    pub b_multiplier: i32,
    pub bias: i32,
    pub shift: u32,
    pub zero_point: i32,
    pub min: i8,
    pub max: i8,
}

impl Int8AddParams {
    /// The parameters of `a + b -> y`, or why XNNPACK would refuse them (scale ratios
    /// outside `[2^-10, 2^8)`).
    pub fn new(
        a: TensorQuant,
        b: TensorQuant,
        y: TensorQuant,
        min: i8,
        max: i8,
    ) -> Result<Self, String> {
        let a_scale = a.scale / y.scale;
        let b_scale = b.scale / y.scale;
        let max_abs = a_scale.abs().max(b_scale.abs());
        let range = 2f32.powi(-10)..2f32.powi(8);
        if !range.contains(&a_scale.abs()) || !range.contains(&b_scale.abs()) {
            return Err(format!(
                "input-to-output scale ratios {a_scale} and {b_scale} are outside [2^-10, 2^8)"
            ));
        }
        let exponent = (max_abs.to_bits() >> 23) as i32 - 127;
        let shift = (20 - exponent) as u32;
        // `scale · 2^shift` by adding to the exponent field, rounded as lrintf.
        let multiplier = |s: f32| -> i32 {
            let m = f32::from_bits(s.abs().to_bits() + (shift << 23)).round_ties_even() as i32;
            if s.is_sign_negative() { -m } else { m }
        };
        let (am, bm) = (multiplier(a_scale), multiplier(b_scale));
        let rounding = 1i32 << (shift - 1);
        let bias = rounding
            .wrapping_sub(am.wrapping_mul(a.zero_point))
            .wrapping_sub(bm.wrapping_mul(b.zero_point));
        Ok(Self {
            a_multiplier: am,
            b_multiplier: bm,
            bias,
            shift,
            zero_point: y.zero_point,
            min,
            max,
        })
    }

    #[inline(always)]
    pub fn apply(&self, a: i8, b: i8) -> i8 {
        let acc = self
            .bias
            .wrapping_add(i32::from(a).wrapping_mul(self.a_multiplier))
            .wrapping_add(i32::from(b).wrapping_mul(self.b_multiplier));
        let v = (acc >> self.shift) + self.zero_point;
        v.clamp(i32::from(self.min), i32::from(self.max)) as i8
    }
}

/// `Multiply` of two qint8 tensors: `(a - za)(b - zb)` requantized with the scale
/// `(sa · sb) / sy` (`xnn_init_qs8_mul_minmax_scalar_params`, fp32 requantization).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Int8MultiplyParams {
    pub a_zero_point: i32,
    pub b_zero_point: i32,
    pub scale: f32,
    pub zero_point: i32,
    pub min: i8,
    pub max: i8,
}

impl Int8MultiplyParams {
    /// The parameters of `a · b -> y`, or why XNNPACK would refuse them.
    pub fn new(
        a: TensorQuant,
        b: TensorQuant,
        y: TensorQuant,
        min: i8,
        max: i8,
    ) -> Result<Self, String> {
        let scale = (a.scale * b.scale) / y.scale;
        if !(2f32.powi(-16)..2f32.powi(8)).contains(&scale) {
            return Err(format!(
                "product-to-output scale {scale} is outside [2^-16, 2^8)"
            ));
        }
        Ok(Self {
            a_zero_point: a.zero_point,
            b_zero_point: b.zero_point,
            scale,
            zero_point: y.zero_point,
            min,
            max,
        })
    }

    #[inline(always)]
    pub fn apply(&self, a: i8, b: i8) -> i8 {
        let acc = (i32::from(a) - self.a_zero_point) * (i32::from(b) - self.b_zero_point);
        requantize(acc, self.scale, self.zero_point, self.min, self.max)
    }
}
