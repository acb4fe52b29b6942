//! Image inputs and classification outputs for `etch run`.
//!
//! An image file (PNG or JPEG, recognised by its extension, decoded by its content)
//! becomes a `[1, 3, H, W]` f32 tensor in NCHW order: RGB values scaled to `[0, 1]`,
//! optionally resized first (bilinear) and normalised per channel as
//! `(x - mean) / std`, the torchvision convention. `--top-k` lists the largest values of
//! an output with their indices and, given a labels file, their labels.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use etch_format::{ScalarType, ShapeDynamism};
use etch_runtime::{HostTensor, ValueInfo};
use image::{ImageFormat, ImageReader, RgbImage};

/// What can go wrong turning an image file into an input tensor, or reading labels.
#[derive(Debug, thiserror::Error)]
pub enum ImageInputError {
    /// The image file could not be read.
    #[error("cannot read image {}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file's bytes are not a PNG or JPEG image.
    #[error("cannot decode image {}: {reason} (etch reads PNG and JPEG)", .path.display())]
    Decode { path: PathBuf, reason: String },
    /// The method input the image was given for is not an image tensor.
    #[error(
        "image {} given for an input that takes {takes}; an image becomes a f32 \
         [1, 3, H, W] tensor (give a .npy file for other inputs)",
        .path.display()
    )]
    NotAnImageInput { path: PathBuf, takes: String },
    /// The image (after `--resize`, if given) does not have the input's height and width.
    #[error(
        "image {} is {height}x{width} (height x width){resized} but the input takes \
         [1, 3, {want_h}, {want_w}]{bound}: use --resize {hint}",
        .path.display(),
        resized = if *.resized { " after --resize" } else { "" },
        bound = if *.dynamic { " at most" } else { "" },
        hint = resize_hint(*.want_h, *.want_w)
    )]
    SizeMismatch {
        path: PathBuf,
        height: u32,
        width: u32,
        resized: bool,
        want_h: usize,
        want_w: usize,
        dynamic: bool,
    },
    /// The labels file could not be read as UTF-8 text.
    #[error("cannot read labels from {}", .path.display())]
    Labels {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn resize_hint(h: usize, w: usize) -> String {
    if h == w {
        h.to_string()
    } else {
        format!("{h}x{w}")
    }
}

/// How an image becomes a tensor (`--resize`, `--mean`, `--std`).
#[derive(Debug, Clone, Default)]
pub struct ImageOptions {
    /// Resize to `(height, width)` first.
    pub resize: Option<(u32, u32)>,
    /// Per-channel mean (RGB) subtracted from the `[0, 1]` values.
    pub mean: Option<[f32; 3]>,
    /// Per-channel standard deviation (RGB) the values are divided by, after the mean.
    pub std: Option<[f32; 3]>,
}

impl ImageOptions {
    /// True when any option was given (they only apply to image inputs).
    pub fn any(&self) -> bool {
        self.resize.is_some() || self.mean.is_some() || self.std.is_some()
    }
}

/// True when `path` names an image file etch decodes (by extension: .png, .jpg, .jpeg).
pub fn is_image_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    [".png", ".jpg", ".jpeg"].iter().any(|e| lower.ends_with(e))
}

/// Parses `a,b,c` into three finite floats (`--mean`).
pub fn parse_triple(text: &str) -> Result<[f32; 3], String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.len() != 3 {
        return Err(format!(
            "expected three comma-separated values (R,G,B), got {text:?}"
        ));
    }
    let mut out = [0f32; 3];
    for (o, p) in out.iter_mut().zip(&parts) {
        *o = p
            .parse::<f32>()
            .map_err(|e| format!("{p:?} is not a number: {e}"))?;
        if !o.is_finite() {
            return Err(format!("{p:?} is not a finite number"));
        }
    }
    Ok(out)
}

/// Parses `--std`: three finite, non-zero floats.
pub fn parse_std(text: &str) -> Result<[f32; 3], String> {
    let std = parse_triple(text)?;
    if std.contains(&0.0) {
        return Err(format!("standard deviations must not be 0, got {text:?}"));
    }
    Ok(std)
}

/// Parses `--resize`: `N` (N x N) or `HxW` (height x width), each at least 1.
pub fn parse_resize(text: &str) -> Result<(u32, u32), String> {
    let parse = |s: &str| match s.trim().parse::<u32>() {
        Ok(0) => Err("sizes must be at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?} is not a size: {e}")),
    };
    match text.split_once(['x', 'X']) {
        Some((h, w)) => Ok((parse(h)?, parse(w)?)),
        None => {
            let n = parse(text)?;
            Ok((n, n))
        }
    }
}

/// Parses `--top-k`: at least 1.
pub fn parse_top_k(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{text:?} is not a count: {e}")),
    }
}

/// The `(height, width)` bounds an image input must meet, and whether they are upper
/// bounds (a dynamic input) rather than exact sizes.
struct ImageShape {
    height: usize,
    width: usize,
    dynamic: bool,
}

/// Checks that `info` is a f32 `[1, 3, H, W]` tensor input.
fn image_shape(path: &Path, info: Option<&ValueInfo>) -> Result<ImageShape, ImageInputError> {
    let not_image = |takes: String| ImageInputError::NotAnImageInput {
        path: path.to_path_buf(),
        takes,
    };
    let t = match info {
        Some(ValueInfo::Tensor(t)) => t,
        Some(other) => return Err(not_image(format!("a {}", other.kind()))),
        None => return Err(not_image("nothing (the method has no such input)".into())),
    };
    let takes = || format!("{} {:?}", t.dtype, t.sizes);
    let dynamic = t.dynamism != ShapeDynamism::Static;
    if t.dtype != ScalarType::Float || t.sizes.len() != 4 {
        return Err(not_image(takes()));
    }
    let batch_ok = if dynamic {
        t.sizes[0] >= 1
    } else {
        t.sizes[0] == 1
    };
    if !batch_ok || t.sizes[1] != 3 {
        return Err(not_image(takes()));
    }
    Ok(ImageShape {
        height: t.sizes[2],
        width: t.sizes[3],
        dynamic,
    })
}

/// Decodes the image at `path` into the tensor for the method input described by
/// `info`, which must be a f32 `[1, 3, H, W]` tensor whose `H` and `W` the image (after
/// `--resize`) matches (or stays within, for a dynamic input).
pub fn load_image(
    path: &Path,
    opts: &ImageOptions,
    info: Option<&ValueInfo>,
) -> Result<HostTensor, ImageInputError> {
    let want = image_shape(path, info)?;
    let bytes = std::fs::read(path).map_err(|source| ImageInputError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let decode_error = |reason: String| ImageInputError::Decode {
        path: path.to_path_buf(),
        reason,
    };
    let reader = ImageReader::new(Cursor::new(&bytes))
        .with_guessed_format()
        .map_err(|e| decode_error(e.to_string()))?;
    match reader.format() {
        Some(ImageFormat::Png | ImageFormat::Jpeg) => {}
        Some(other) => return Err(decode_error(format!("it is {other:?}"))),
        None => return Err(decode_error("not a known image format".into())),
    }
    // The reader's default limits bound the memory a hostile header can claim.
    let img = reader
        .decode()
        .map_err(|e| decode_error(e.to_string()))?
        .to_rgb8();
    let (height, width) = opts.resize.unwrap_or((img.height(), img.width()));
    let fits = |got: u32, bound: usize| {
        let got = got as usize;
        if want.dynamic {
            got <= bound
        } else {
            got == bound
        }
    };
    if !fits(height, want.height) || !fits(width, want.width) {
        return Err(ImageInputError::SizeMismatch {
            path: path.to_path_buf(),
            height,
            width,
            resized: opts.resize.is_some(),
            want_h: want.height,
            want_w: want.width,
            dynamic: want.dynamic,
        });
    }
    let img = if (height, width) == (img.height(), img.width()) {
        img
    } else {
        image::imageops::resize(&img, width, height, image::imageops::FilterType::Triangle)
    };
    let data = rgb_to_nchw(
        &img,
        opts.mean.unwrap_or([0.0; 3]),
        opts.std.unwrap_or([1.0; 3]),
    );
    Ok(HostTensor::from_slice(
        &[1, 3, height as usize, width as usize],
        &data,
    ))
}

/// An RGB image as `[3, H, W]` f32 values `(v / 255 - mean[c]) / std[c]`, channel-major.
pub fn rgb_to_nchw(img: &RgbImage, mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    let mut data = vec![0f32; 3 * h * w];
    for (x, y, px) in img.enumerate_pixels() {
        for c in 0..3 {
            let v = f32::from(px.0[c]) / 255.0;
            data[(c * h + y as usize) * w + x as usize] = (v - mean[c]) / std[c];
        }
    }
    data
}

/// The `k` largest values of a float tensor (all its elements, in row-major order) as
/// `(index, value)`, largest first; ties keep the lower index first, NaN sorts above
/// every number. `None` for a tensor that is not f32, f64, f16 or bf16.
pub fn top_k(t: &HostTensor, k: usize) -> Option<Vec<(usize, f32)>> {
    let values: Vec<f32> = match t.dtype {
        ScalarType::Float => t.as_slice::<f32>()?,
        ScalarType::Double => t.as_slice::<f64>()?.into_iter().map(|v| v as f32).collect(),
        ScalarType::Half => t
            .as_slice::<half::f16>()?
            .into_iter()
            .map(f32::from)
            .collect(),
        ScalarType::BFloat16 => t
            .as_slice::<half::bf16>()?
            .into_iter()
            .map(f32::from)
            .collect(),
        _ => return None,
    };
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    Some(order.into_iter().take(k).map(|i| (i, values[i])).collect())
}

/// One label per line of `path` (line `i`, counting from 0, names index `i`); a
/// trailing `\r` and surrounding spaces are dropped.
pub fn read_labels(path: &Path) -> Result<Vec<String>, ImageInputError> {
    let text = std::fs::read_to_string(path).map_err(|source| ImageInputError::Labels {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(text.lines().map(|l| l.trim().to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use etch_runtime::TensorInfo;

    fn input(dtype: ScalarType, sizes: &[usize], dynamism: ShapeDynamism) -> ValueInfo {
        ValueInfo::Tensor(TensorInfo {
            dtype,
            sizes: sizes.to_vec(),
            dim_order: (0..sizes.len() as u8).collect(),
            dynamism,
            memory_planned: true,
        })
    }

    fn write_png(dir: &Path, img: &RgbImage) -> PathBuf {
        let path = dir.join("img.png");
        img.save(&path).unwrap();
        path
    }

    #[test]
    fn option_parsers() {
        assert_eq!(parse_triple("0.5, 1,-2").unwrap(), [0.5, 1.0, -2.0]);
        assert!(parse_triple("1,2").is_err());
        assert!(parse_triple("1,x,2").is_err());
        assert!(parse_triple("1,inf,2").is_err());
        assert!(parse_std("1,0,1").unwrap_err().contains("must not be 0"));
        assert_eq!(parse_resize("224").unwrap(), (224, 224));
        assert_eq!(parse_resize("32x48").unwrap(), (32, 48));
        assert!(parse_resize("0").is_err());
        assert!(parse_resize("3x").is_err());
        assert!(parse_resize("-3").is_err());
        assert!(parse_top_k("0").is_err());
        assert_eq!(parse_top_k("5").unwrap(), 5);
        assert!(is_image_path("a/B.PNG") && is_image_path("x.jpeg") && is_image_path("x.jpg"));
        assert!(!is_image_path("x.npy") && !is_image_path("3"));
    }

    #[test]
    fn a_2x2_image_becomes_normalised_nchw_values() {
        // Pixels (x, y): (0,0) red, (1,0) green, (0,1) blue, (1,1) (51, 102, 255).
        let img = RgbImage::from_fn(2, 2, |x, y| match (x, y) {
            (0, 0) => image::Rgb([255, 0, 0]),
            (1, 0) => image::Rgb([0, 255, 0]),
            (0, 1) => image::Rgb([0, 0, 255]),
            _ => image::Rgb([51, 102, 255]),
        });
        let (mean, std) = ([0.5, 0.25, 0.0], [0.5, 0.25, 2.0]);
        // Channel R: (v - 0.5) / 0.5 for v = 1, 0, 0, 0.2.
        // Channel G: (v - 0.25) / 0.25 for v = 0, 1, 0, 0.4.
        // Channel B: v / 2 for v = 0, 0, 1, 1.
        let want = [
            1.0, -1.0, -1.0, -0.6, //
            -1.0, 3.0, -1.0, 0.6, //
            0.0, 0.0, 0.5, 0.5,
        ];
        let got = rgb_to_nchw(&img, mean, std);
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }

        // Through a PNG file and the input check, without normalisation: v / 255.
        let dir = tempfile::tempdir().unwrap();
        let png = write_png(dir.path(), &img);
        let info = input(ScalarType::Float, &[1, 3, 2, 2], ShapeDynamism::Static);
        let t = load_image(&png, &ImageOptions::default(), Some(&info)).unwrap();
        assert_eq!(t.sizes, [1, 3, 2, 2]);
        let v = t.as_slice::<f32>().unwrap();
        let raw = [255., 0., 0., 51., 0., 255., 0., 102., 0., 0., 255., 255.];
        for (g, r) in v.iter().zip(raw) {
            assert_eq!(*g, r / 255.0);
        }
    }

    #[test]
    fn image_inputs_are_checked_against_the_method_input() {
        let dir = tempfile::tempdir().unwrap();
        let png = write_png(dir.path(), &RgbImage::new(4, 6));
        let opts = ImageOptions::default();
        let check = |info: ValueInfo, opts: &ImageOptions| load_image(&png, opts, Some(&info));
        let static_ = ShapeDynamism::Static;
        // Height 6, width 4.
        assert!(check(input(ScalarType::Float, &[1, 3, 6, 4], static_), &opts).is_ok());
        let e = check(input(ScalarType::Float, &[1, 3, 8, 8], static_), &opts).unwrap_err();
        assert!(matches!(e, ImageInputError::SizeMismatch { .. }), "{e}");
        assert!(e.to_string().contains("use --resize 8"), "{e}");
        let e = check(input(ScalarType::Float, &[1, 3, 8, 5], static_), &opts).unwrap_err();
        assert!(e.to_string().contains("use --resize 8x5"), "{e}");
        let resized = ImageOptions {
            resize: Some((8, 5)),
            ..Default::default()
        };
        let t = check(input(ScalarType::Float, &[1, 3, 8, 5], static_), &resized).unwrap();
        assert_eq!(t.sizes, [1, 3, 8, 5]);
        // A dynamic input takes any size within its bounds.
        let bounded = input(
            ScalarType::Float,
            &[1, 3, 16, 16],
            ShapeDynamism::DynamicBound,
        );
        assert_eq!(check(bounded.clone(), &opts).unwrap().sizes, [1, 3, 6, 4]);
        let big = ImageOptions {
            resize: Some((17, 4)),
            ..Default::default()
        };
        assert!(check(bounded, &big).is_err());
        for bad in [
            input(ScalarType::Long, &[1, 3, 6, 4], static_),
            input(ScalarType::Float, &[3, 6, 4], static_),
            input(ScalarType::Float, &[1, 1, 6, 4], static_),
            input(ScalarType::Float, &[2, 3, 6, 4], static_),
            ValueInfo::Int(3),
        ] {
            let e = check(bad, &opts).unwrap_err();
            assert!(matches!(e, ImageInputError::NotAnImageInput { .. }), "{e}");
        }
    }

    #[test]
    fn unreadable_and_undecodable_files_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let info = input(ScalarType::Float, &[1, 3, 2, 2], ShapeDynamism::Static);
        let opts = ImageOptions::default();
        let missing = dir.path().join("missing.png");
        let e = load_image(&missing, &opts, Some(&info)).unwrap_err();
        assert!(matches!(e, ImageInputError::Read { .. }), "{e}");
        let junk = dir.path().join("junk.png");
        std::fs::write(&junk, b"not an image at all").unwrap();
        let e = load_image(&junk, &opts, Some(&info)).unwrap_err();
        assert!(matches!(e, ImageInputError::Decode { .. }), "{e}");
        // A PNG signature followed by garbage.
        let truncated = dir.path().join("truncated.png");
        std::fs::write(&truncated, b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\xff\xff").unwrap();
        let e = load_image(&truncated, &opts, Some(&info)).unwrap_err();
        assert!(matches!(e, ImageInputError::Decode { .. }), "{e}");
    }

    #[test]
    fn top_k_sorts_descending_and_skips_non_floats() {
        let t = HostTensor::from_slice(&[1, 5], &[0.1f32, 3.0, -1.0, 3.0, 2.0]);
        assert_eq!(top_k(&t, 3).unwrap(), vec![(1, 3.0), (3, 3.0), (4, 2.0)]);
        assert_eq!(top_k(&t, 9).unwrap().len(), 5);
        let h = HostTensor::from_slice(
            &[3],
            &[
                half::f16::from_f32(1.0),
                half::f16::from_f32(4.0),
                half::f16::from_f32(2.0),
            ],
        );
        assert_eq!(top_k(&h, 1).unwrap(), vec![(1, 4.0)]);
        let i = HostTensor::from_slice(&[2], &[1i64, 2]);
        assert!(top_k(&i, 1).is_none());
    }
}
