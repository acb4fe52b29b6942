//! The folder: a value table with the method's constants bound (as a session binds
//! them), kernels run on it once, and the buffers the folded constants are kept in.

use std::sync::Arc;

use etch_format::{ExecutionPlan, ProgramFile, Value as FileValue};
use etch_kernels::{Args, EValue, KernelContext, KernelFn, Tensor, ThreadPool};
use etch_memory::{
    AlignedBuffer, AllocError, MemoryBudget, RegionId, Reservation, SLAB_MIN_BYTES, SharedBytes,
    Span, Storage, TempScope, WeightBuffer, align_up,
};

use super::super::load::Loader;
use super::lifetimes::Placement;
use super::uses::Uses;
use super::{Folded, FoldedValue, Place};
use crate::RuntimeError;

/// Alignment of each folded constant (a cache line, enough for every dtype).
const FOLDED_ALIGNMENT: usize = 64;

pub(super) struct Folder<'a> {
    budget: &'a MemoryBudget,
    loader: Loader<'a>,
    /// The file's values (constants bound, everything else unbound), then the values
    /// folding appended.
    values: Vec<EValue>,
    /// Per value: a constant tensor, of the file (that no step writes) or folded.
    constant: Vec<bool>,
    /// Load-time kernels run inline.
    pool: ThreadPool,
    /// Where kernel outs are written before they are copied into a folded buffer.
    scratch: Option<(RegionId, usize)>,
    /// The region of each folded buffer in `loader.storage`.
    buffer_regions: Vec<RegionId>,
    folded: Folded,
    /// Scratch, held against the budget until folding ends.
    _scratch_reservations: Vec<Reservation>,
}

impl<'a> Folder<'a> {
    /// A folder over `plan`'s values, or `None` when they cannot be bound.
    pub fn new(
        file: &'a ProgramFile,
        plan: &'a ExecutionPlan,
        budget: &'a MemoryBudget,
        uses: &Uses,
    ) -> Option<Self> {
        let mut loader = Loader {
            file,
            plan,
            storage: Storage::new(),
            planned: None,
            program_region: None,
            mutable_inits: Vec::new(),
        };
        let mut values = Vec::with_capacity(plan.values.len());
        let mut constant = Vec::with_capacity(plan.values.len());
        for (i, v) in plan.values.iter().enumerate() {
            values.push(loader.value(i, v, false).ok()?);
            constant.push(match v {
                FileValue::Tensor(t) => {
                    t.data_buffer_idx > 0 && t.allocation_info.is_none() && uses.writers[i] == 0
                }
                _ => false,
            });
        }
        Some(Folder {
            budget,
            loader,
            values,
            constant,
            pool: ThreadPool::serial(),
            scratch: None,
            buffer_regions: Vec::new(),
            folded: Folded::default(),
            _scratch_reservations: Vec::new(),
        })
    }

    /// The method's plan in the file.
    pub fn plan(&self) -> &'a ExecutionPlan {
        self.loader.plan
    }

    /// The constants made, for the plan to keep.
    pub fn finish(mut self) -> Folded {
        self.folded.added_values = self.values.len().saturating_sub(self.plan().values.len());
        self.folded
    }

    /// True when value `v` is a constant tensor.
    pub fn is_constant(&self, v: usize) -> bool {
        self.constant.get(v) == Some(&true)
    }

    /// Value `v`'s tensor metadata, if it is a tensor.
    pub fn tensor(&self, v: usize) -> Option<Tensor> {
        self.values.get(v).and_then(EValue::as_tensor).copied()
    }

    pub fn err(&self, value: usize, what: impl Into<String>) -> RuntimeError {
        self.loader.err(value, what)
    }

    fn alloc_err(&self, source: AllocError) -> RuntimeError {
        RuntimeError::Alloc {
            method: self.plan().name.clone(),
            source,
        }
    }

    /// The elements of constant f32 tensor `v` in storage order, or `None` when `v` is
    /// not one.
    pub fn f32_data(&mut self, v: usize) -> Result<Option<Vec<f32>>, RuntimeError> {
        let Some(t) = self.tensor(v).filter(|_| self.is_constant(v)) else {
            return Ok(None);
        };
        let Some(span) = t.data().filter(|s| s.len >= t.nbytes()) else {
            return Ok(None);
        };
        if t.dtype() != etch_format::ScalarType::Float {
            return Ok(None);
        }
        let span = Span {
            len: t.nbytes(),
            ..span
        };
        match self.loader.storage.bytes(span) {
            Ok(bytes) => Ok(Some(bytemuck::pod_collect_to_vec(bytes))),
            Err(e) => Err(self.err(v, e.to_string())),
        }
    }

    /// Runs `kernel` on `args` once, its `outs` bound to scratch, and keeps the outs as
    /// constants. `false` (nothing kept, the outs unbound again) when the kernel fails,
    /// resizes an out, or points one at bytes that are not constants.
    pub fn evaluate(
        &mut self,
        kernel: KernelFn,
        args: &[usize],
        outs: &[usize],
    ) -> Result<bool, RuntimeError> {
        let Some(metas) = outs
            .iter()
            .map(|&o| self.tensor(o))
            .collect::<Option<Vec<_>>>()
        else {
            return Ok(false);
        };
        let lens: Vec<usize> = metas.iter().map(Tensor::nbytes).collect();
        let (offsets, total) = aligned_offsets(&lens).ok_or_else(|| {
            self.alloc_err(AllocError::SizeOverflow {
                size: usize::MAX,
                align: FOLDED_ALIGNMENT,
            })
        })?;
        let scratch = self.scratch(total)?;
        for ((&o, meta), (&offset, &len)) in outs.iter().zip(&metas).zip(offsets.iter().zip(&lens))
        {
            let mut t = *meta;
            t.set_data(Some(Span {
                region: scratch,
                offset,
                len,
            }));
            self.values[o] = EValue::Tensor(t);
        }
        let ran = {
            let ctx = KernelContext::new(
                self.loader.storage.access(),
                TempScope::new(None),
                &self.pool,
            );
            let mut a = Args::new(&mut self.values, args);
            kernel(&ctx, &mut a).is_ok()
        };
        // Where each out landed: in the scratch (`None`: to be copied), or re-pointed at
        // a constant (a view).
        let mut landed = Vec::with_capacity(outs.len());
        for (&o, meta) in outs.iter().zip(&metas) {
            let at = self
                .tensor(o)
                .filter(|t| ran && same_layout(t, meta))
                .and_then(|t| {
                    let span = t.data()?;
                    if span.region == scratch {
                        Some((t, None))
                    } else {
                        self.place_of(span).map(|p| (t, Some(p)))
                    }
                });
            match at {
                Some((t, place)) => landed.push((o, t, place)),
                None => break,
            }
        }
        if landed.len() != outs.len() {
            for (&o, meta) in outs.iter().zip(&metas) {
                self.values[o] = EValue::Tensor(*meta);
            }
            return Ok(false);
        }
        let copies: Vec<(usize, Span)> = landed
            .iter()
            .filter(|(_, _, place)| place.is_none())
            .filter_map(|(o, t, _)| {
                let span = t.data()?;
                Some((
                    *o,
                    Span {
                        len: t.nbytes(),
                        ..span
                    },
                ))
            })
            .collect();
        let copy_lens: Vec<usize> = copies.iter().map(|(_, s)| s.len).collect();
        let (buffer, dst) = self.store(&copy_lens, |storage, buf, dst| {
            for ((o, src), &at) in copies.iter().zip(dst) {
                let bytes = storage.bytes(*src).map_err(|e| e.to_string());
                let target = buf.get_mut(at..at + src.len);
                match (bytes, target) {
                    (Ok(b), Some(t)) if b.len() == t.len() => t.copy_from_slice(b),
                    (Err(e), _) => return Err((*o, e)),
                    _ => return Err((*o, "folded out does not fit its buffer".into())),
                }
            }
            Ok(())
        })?;
        let mut copied = copies.iter().zip(dst);
        for (o, t, place) in landed {
            let place = match place {
                Some(p) => p,
                None => match copied.next() {
                    Some(((_, src), offset)) => Place::Buffer {
                        buffer,
                        offset,
                        len: src.len,
                    },
                    None => return Err(self.err(o, "folded out without bytes")),
                },
            };
            self.bind(o, t, place);
        }
        Ok(true)
    }

    /// Appends f32 constants (`tensor` metadata, elements in its storage order), stored
    /// in one new folded buffer, and returns their value indices.
    pub fn add_f32_constants(
        &mut self,
        parts: &[(Tensor, &[f32])],
    ) -> Result<Vec<usize>, RuntimeError> {
        let lens: Vec<usize> = parts
            .iter()
            .map(|(_, d)| std::mem::size_of_val(*d))
            .collect();
        let first = self.values.len();
        let (buffer, offsets) = self.store(&lens, |_, buf, offsets| {
            for (k, ((_, data), &at)) in parts.iter().zip(offsets).enumerate() {
                let bytes: &[u8] = bytemuck::cast_slice(data);
                match buf.get_mut(at..at + bytes.len()) {
                    Some(t) => t.copy_from_slice(bytes),
                    None => return Err((first + k, "folded constant does not fit".into())),
                }
            }
            Ok(())
        })?;
        let mut indices = Vec::with_capacity(parts.len());
        for (((t, _), offset), len) in parts.iter().zip(offsets).zip(lens) {
            let index = self.values.len();
            self.bind(
                index,
                *t,
                Place::Buffer {
                    buffer,
                    offset,
                    len,
                },
            );
            indices.push(index);
        }
        Ok(indices)
    }

    /// Moves planned tensor `v` to other planned bytes in every session.
    pub fn relocate(&mut self, v: usize, to: Placement) {
        self.folded.moved.push((v, to));
    }

    /// Makes value `index` (an existing value or the next new one) the constant at
    /// `place`.
    fn bind(&mut self, index: usize, mut tensor: Tensor, place: Place) {
        tensor.set_data(None);
        self.folded.values.push(FoldedValue {
            index,
            tensor,
            place,
        });
        let loader = &mut self.loader;
        let span = place.span(|| loader.program_region(), &self.buffer_regions);
        tensor.set_data(span);
        if index == self.values.len() {
            self.values.push(EValue::Tensor(tensor));
            self.constant.push(true);
        } else {
            self.values[index] = EValue::Tensor(tensor);
            self.constant[index] = true;
        }
    }

    /// Where a span of the folder's storage lives in a session, if it is constant.
    fn place_of(&self, span: Span) -> Option<Place> {
        if Some(span.region) == self.loader.program_region {
            return Some(Place::Program {
                offset: span.offset,
                len: span.len,
            });
        }
        let buffer = self.buffer_regions.iter().position(|&r| r == span.region)?;
        Some(Place::Buffer {
            buffer,
            offset: span.offset,
            len: span.len,
        })
    }

    /// A new folded buffer of `lens` parts, each aligned, reserved against the budget
    /// and filled by `fill(storage, buffer, offsets)` (which names the value at fault
    /// when it fails); returns the buffer's index and the parts' offsets.
    fn store(
        &mut self,
        lens: &[usize],
        fill: impl FnOnce(&mut Storage, &mut [u8], &[usize]) -> Result<(), (usize, String)>,
    ) -> Result<(usize, Vec<usize>), RuntimeError> {
        let (offsets, total) = aligned_offsets(lens).ok_or_else(|| {
            self.alloc_err(AllocError::SizeOverflow {
                size: usize::MAX,
                align: FOLDED_ALIGNMENT,
            })
        })?;
        let name = &self.plan().name;
        let reservation = self.budget.reserve(
            || format!("the folded constants of method {name:?}"),
            total as u64,
        )?;
        // Large buffers (the weights every call streams) on huge pages: on 4 KiB pages
        // the prefetcher stops at each page, and MobileNetV2's classifier (5 MB) read at
        // 11 GB/s.
        let bytes = if total >= SLAB_MIN_BYTES {
            let mut buf = WeightBuffer::<u8>::zeroed(total).map_err(|e| self.alloc_err(e))?;
            fill(&mut self.loader.storage, &mut buf, &offsets)
                .map_err(|(value, what)| self.err(value, what))?;
            SharedBytes::Weights(Arc::new(buf))
        } else {
            let mut buf =
                AlignedBuffer::zeroed(total, FOLDED_ALIGNMENT).map_err(|e| self.alloc_err(e))?;
            fill(&mut self.loader.storage, buf.as_mut_slice(), &offsets)
                .map_err(|(value, what)| self.err(value, what))?;
            SharedBytes::Heap(Arc::new(buf))
        };
        self.buffer_regions
            .push(self.loader.storage.add_shared(bytes.clone()));
        self.folded.buffers.push(bytes);
        self.folded.bytes += total;
        self.folded._reservations.push(reservation);
        Ok((self.folded.buffers.len() - 1, offsets))
    }

    /// A writable scratch region of at least `len` bytes (grown by doubling; the old
    /// one stays in the storage until folding ends).
    fn scratch(&mut self, len: usize) -> Result<RegionId, RuntimeError> {
        if let Some((region, have)) = self.scratch
            && have >= len
        {
            return Ok(region);
        }
        let len = len.max(self.scratch.map_or(0, |(_, have)| have.saturating_mul(2)));
        let name = &self.plan().name;
        let reservation = self.budget.reserve(
            || format!("scratch for folding the constants of method {name:?}"),
            len as u64,
        )?;
        let buf = AlignedBuffer::zeroed(len, FOLDED_ALIGNMENT).map_err(|e| self.alloc_err(e))?;
        let region = self.loader.storage.add_buffer(buf);
        self._scratch_reservations.push(reservation);
        self.scratch = Some((region, len));
        Ok(region)
    }
}

/// The offset of each part laid end to end at [`FOLDED_ALIGNMENT`], and the total.
fn aligned_offsets(lens: &[usize]) -> Option<(Vec<usize>, usize)> {
    let mut offsets = Vec::with_capacity(lens.len());
    let mut total = 0usize;
    for &len in lens {
        offsets.push(total);
        total = align_up(total.checked_add(len)?, FOLDED_ALIGNMENT)?;
    }
    Some((offsets, total))
}

/// True when a kernel left `t` with the dtype, sizes and dim order of the file's `meta`.
fn same_layout(t: &Tensor, meta: &Tensor) -> bool {
    t.dtype() == meta.dtype() && t.sizes() == meta.sizes() && t.dim_order() == meta.dim_order()
}
