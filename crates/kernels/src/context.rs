//! What a kernel receives besides its arguments: checked access to tensor bytes,
//! scratch from the temp allocator, and the thread pool.

use bytemuck::Pod;
use etch_memory::{Access, ScratchStats, Span, TempScope};

use crate::{Element, KernelError, Tensor, ThreadPool};

/// What a kernel step does beyond or short of what its arguments say, arranged when
/// the program was loaded: an elementwise activation that followed the step, folded
/// into it and applied to each output as it is written (XNNPACK's `output_min` /
/// `output_max`), or an out that nothing reads, which the kernel may leave unwritten.
/// Only kernels that declare so honour it (see [`Epilogue::FUSABLE_OPS`] and
/// [`Epilogue::INDICES_OPS`]); every other step has the default, which does nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Epilogue {
    /// Every output clamped into `[min, max]` as `hardtanh` does: below `min` it is
    /// `min`, above `max` it is `max`, otherwise (NaN included) it is kept.
    pub clamp: Option<(f32, f32)>,
    /// The step's `indices` out is read by no later step and is no method output: the
    /// kernel may write the values alone (ResNet's max pooling, whose int64 indices
    /// are twice the bytes of its values).
    pub indices_unread: bool,
}

impl Epilogue {
    /// The operators whose kernels apply an epilogue's clamp.
    pub const FUSABLE_OPS: &'static [&'static str] = &["aten::convolution.out"];

    /// The operators whose kernels may skip unread indices.
    pub const INDICES_OPS: &'static [&'static str] = &["aten::max_pool2d_with_indices.out"];

    /// `v` with the epilogue applied.
    #[inline(always)]
    pub fn apply(&self, v: f32) -> f32 {
        self.clamp
            .map_or(v, |bounds| etch_linalg::output_clamp(v, bounds))
    }
}

/// Where a delegate reports the time of each node it runs, when its caller profiles
/// (`etch run --profile`): one record per node run, under a name that says the node's
/// kind (and its types where they choose the kernel, e.g. `Conv2d qs8`).
pub trait NodeProfiler: Sync {
    /// Node `name` ran for `nanos` nanoseconds.
    fn record(&self, name: &str, nanos: u64);
}

/// The context of one kernel call. Everything borrowed from it ends with the call.
pub struct KernelContext<'a> {
    access: Access<'a>,
    temp: TempScope<'a>,
    pool: &'a ThreadPool,
    epilogue: Epilogue,
    profiler: Option<&'a dyn NodeProfiler>,
}

impl<'a> KernelContext<'a> {
    /// A context over a storage access, a scratch scope and a pool.
    pub fn new(access: Access<'a>, temp: TempScope<'a>, pool: &'a ThreadPool) -> Self {
        Self {
            access,
            temp,
            pool,
            epilogue: Epilogue::default(),
            profiler: None,
        }
    }

    /// This context, for a delegate call whose nodes report their times to `profiler`.
    pub fn with_profiler(self, profiler: Option<&'a dyn NodeProfiler>) -> Self {
        Self { profiler, ..self }
    }

    /// Where a delegate reports its nodes' times (`None`: nobody is profiling).
    pub fn profiler(&self) -> Option<&'a dyn NodeProfiler> {
        self.profiler
    }

    /// This context, for a step that also applies `epilogue` to its outputs.
    pub fn with_epilogue(self, epilogue: Epilogue) -> Self {
        Self { epilogue, ..self }
    }

    /// The epilogue folded into this step (the default: none).
    pub fn epilogue(&self) -> Epilogue {
        self.epilogue
    }

    /// The thread pool.
    pub fn pool(&self) -> &ThreadPool {
        self.pool
    }

    /// Scratch handed out so far in this call.
    pub fn scratch_stats(&self) -> ScratchStats {
        self.temp.stats()
    }

    fn span(t: &Tensor) -> Result<Span, KernelError> {
        let data = t.data().ok_or(KernelError::NoData)?;
        let nbytes = t.nbytes();
        if nbytes > data.len {
            return Err(KernelError::invalid(format!(
                "tensor of {nbytes} bytes does not fit its {}-byte storage",
                data.len
            )));
        }
        Ok(Span {
            len: nbytes,
            ..data
        })
    }

    fn check_dtype<T: Element>(t: &Tensor) -> Result<(), KernelError> {
        if t.dtype() == T::DTYPE {
            Ok(())
        } else {
            Err(KernelError::DtypeMismatch {
                expected: T::DTYPE,
                found: t.dtype(),
            })
        }
    }

    /// The tensor's elements (current numel), checking that `T` is its dtype.
    pub fn read<T: Element>(&self, t: &Tensor) -> Result<&[T], KernelError> {
        Self::check_dtype::<T>(t)?;
        self.read_raw(t)
    }

    /// The tensor's elements, mutably, checking that `T` is its dtype.
    #[allow(clippy::mut_from_ref)]
    pub fn write<T: Element>(&self, t: &Tensor) -> Result<&mut [T], KernelError> {
        Self::check_dtype::<T>(t)?;
        self.write_raw(t)
    }

    /// The tensor's bytes viewed as `T` without a dtype check (bool as `u8`, bits).
    pub fn read_raw<T: Pod>(&self, t: &Tensor) -> Result<&[T], KernelError> {
        Ok(self.access.slice(Self::span(t)?)?)
    }

    /// Mutable view as `T` without a dtype check.
    #[allow(clippy::mut_from_ref)]
    pub fn write_raw<T: Pod>(&self, t: &Tensor) -> Result<&mut [T], KernelError> {
        Ok(self.access.slice_mut(Self::span(t)?)?)
    }

    /// The tensor's bytes.
    pub fn read_bytes(&self, t: &Tensor) -> Result<&[u8], KernelError> {
        Ok(self.access.bytes(Self::span(t)?)?)
    }

    /// The tensor's bytes, mutably.
    #[allow(clippy::mut_from_ref)]
    pub fn write_bytes(&self, t: &Tensor) -> Result<&mut [u8], KernelError> {
        Ok(self.access.bytes_mut(Self::span(t)?)?)
    }

    /// `n` zeroed scratch elements, 64-byte aligned, valid for this call.
    #[allow(clippy::mut_from_ref)]
    pub fn scratch<T: Pod>(&self, n: usize) -> Result<&mut [T], KernelError> {
        Ok(self.temp.scratch(n)?)
    }

    /// `n` scratch elements of unspecified value (stale or zero), for scratch the
    /// kernel writes in full before reading it: packing buffers, im2col columns. Saves
    /// clearing it when the temp allocator's blocks are initialised memory.
    #[allow(clippy::mut_from_ref)]
    pub fn scratch_dirty<T: Pod>(&self, n: usize) -> Result<&mut [T], KernelError> {
        Ok(self.temp.scratch_dirty(n)?)
    }

    /// `n` scratch elements set to `value`.
    #[allow(clippy::mut_from_ref)]
    pub fn scratch_filled<T: Pod>(&self, n: usize, value: T) -> Result<&mut [T], KernelError> {
        Ok(self.temp.scratch_filled(n, value)?)
    }
}
