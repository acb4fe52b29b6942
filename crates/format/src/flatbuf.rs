//! A hand-written, bounds-checked FlatBuffers reader, public so that delegates
//! (the XNNPACK payload's `XNNGraph`, in `etch-xnnpack`) reuse it for their own
//! schemas instead of writing a second one.
//!
//! Usage: [`Buffer::new`] over the bytes, [`Buffer::root`] for the root table, then
//! [`Table`] accessors by field id (the field's position in the `.fbs` schema, a union
//! taking two ids). Every accessor takes the [`FieldPath`] of what it reads, so an
//! error names the field (`xnodes[3].filter_id`).
//!
//! ```
//! use etch_format::flatbuf::{Buffer, FieldPath};
//! // Root offset 12 -> table at 12, whose vtable (at 4) holds one field at +4.
//! let mut bytes = vec![12, 0, 0, 0, 6, 0, 8, 0, 4, 0, 0, 0];
//! bytes.extend_from_slice(&8i32.to_le_bytes());
//! bytes.extend_from_slice(&42u32.to_le_bytes());
//! let buffer = Buffer::new(&bytes);
//! let root = buffer.root(&FieldPath::Root)?;
//! assert_eq!(root.scalar::<u32>(0, 0, &FieldPath::Root.field("answer"))?, 42);
//! assert_eq!(root.scalar::<u32>(1, 7, &FieldPath::Root.field("absent"))?, 7);
//! # Ok::<(), etch_format::FormatError>(())
//! ```
//!
//! Why not flatc-generated code or a FlatBuffers crate: generated readers rely on
//! `unsafe` unchecked accessors once a verifier has run, and a verifier failure says
//! only "invalid buffer". This reader checks every offset as it follows it, never
//! panics, and reports the failing field as a path (`execution_plan[0].values[3]`),
//! which is what a user with a corrupt file needs.
//!
//! Encoding recap (brief §1.2): a table at `p` starts with an `i32` soffset to its
//! vtable at `p - soffset`; the vtable is `u16 vtable_len, u16 object_len, u16
//! field_offset[..]`; reference fields hold a `u32` offset relative to the field;
//! vectors and strings are a `u32` length followed by the elements; a union field
//! uses two ids, the `u8` tag at `k` and the table at `k + 1`.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use crate::error::{FormatError, Result};
use crate::limits::{MAX_DECODED_ITEMS_PER_BYTE, MAX_TABLE_DEPTH, MIN_DECODE_BUDGET};

/// The location of a field, built on the stack as the parser descends and rendered
/// only when an error is reported.
#[derive(Clone, Copy, Debug)]
pub enum FieldPath<'p> {
    /// The root table (renders as nothing, so children read `execution_plan[0]`).
    Root,
    /// The field `name` of the parent.
    Field(&'p FieldPath<'p>, &'static str),
    /// Element `index` of the parent vector.
    Index(&'p FieldPath<'p>, usize),
}

impl<'p> FieldPath<'p> {
    /// The child field `name`.
    pub fn field(&'p self, name: &'static str) -> FieldPath<'p> {
        FieldPath::Field(self, name)
    }

    /// The element `index` of this vector.
    pub fn index(&'p self, index: usize) -> FieldPath<'p> {
        FieldPath::Index(self, index)
    }

    fn is_root(&self) -> bool {
        matches!(self, FieldPath::Root)
    }
}

impl fmt::Display for FieldPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldPath::Root => f.write_str("<root>"),
            FieldPath::Field(parent, name) if parent.is_root() => f.write_str(name),
            FieldPath::Field(parent, name) => write!(f, "{parent}.{name}"),
            FieldPath::Index(parent, i) if parent.is_root() => write!(f, "[{i}]"),
            FieldPath::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// A little-endian scalar that can be read from a FlatBuffer.
pub trait Scalar: Copy + 'static {
    /// Encoded size in bytes.
    const SIZE: usize;
    /// Decodes `Self` from the first `SIZE` bytes of `bytes`, if there are that many.
    fn decode(bytes: &[u8]) -> Option<Self>;
}

macro_rules! impl_scalar {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn decode(bytes: &[u8]) -> Option<Self> {
                bytes.first_chunk::<{ std::mem::size_of::<$t>() }>().map(|b| <$t>::from_le_bytes(*b))
            }
        }
    )*};
}
impl_scalar!(u8, i8, u16, i16, i32, u32, i64, u64, f32, f64);

impl Scalar for bool {
    const SIZE: usize = 1;
    fn decode(bytes: &[u8]) -> Option<Self> {
        bytes.first().map(|b| *b != 0)
    }
}

/// The buffer being read and the decode budget shared by everything read from it.
pub struct Buffer<'a> {
    data: &'a [u8],
    budget: Cell<u64>,
}

impl<'a> Buffer<'a> {
    /// A reader over `data`, whose byte 0 holds the root offset.
    pub fn new(data: &'a [u8]) -> Self {
        let budget = (data.len() as u64)
            .saturating_mul(MAX_DECODED_ITEMS_PER_BYTE)
            .max(MIN_DECODE_BUDGET);
        Buffer {
            data,
            budget: Cell::new(budget),
        }
    }

    /// The root table.
    pub fn root(&'a self, path: &FieldPath<'_>) -> Result<Table<'a>> {
        let offset = self.read::<u32>(0, path)?;
        self.table_at(offset as usize, path, 0)
    }

    /// Takes `n` items from the decode budget.
    fn charge(&self, n: u64, path: &FieldPath<'_>) -> Result<()> {
        let left = self.budget.get();
        let what = "decoded items (tables, elements, string bytes)";
        FormatError::check_limit(path, what, n, left)?;
        self.budget.set(left - n);
        Ok(())
    }

    /// The bytes `[pos, pos + len)`.
    fn bytes(&self, pos: usize, len: usize, path: &FieldPath<'_>) -> Result<&'a [u8]> {
        pos.checked_add(len)
            .and_then(|end| self.data.get(pos..end))
            .ok_or_else(|| {
                FormatError::out_of_bounds(
                    path,
                    format!(
                        "offset {pos} + length {len} exceeds buffer of {} bytes",
                        self.data.len()
                    ),
                )
            })
    }

    fn read<T: Scalar>(&self, pos: usize, path: &FieldPath<'_>) -> Result<T> {
        let bytes = self.bytes(pos, T::SIZE, path)?;
        T::decode(bytes).ok_or_else(|| FormatError::out_of_bounds(path, "short scalar"))
    }

    /// Follows the `u32` offset stored at `pos`.
    fn follow(&self, pos: usize, path: &FieldPath<'_>) -> Result<usize> {
        let rel = self.read::<u32>(pos, path)? as usize;
        pos.checked_add(rel)
            .filter(|target| *target < self.data.len())
            .ok_or_else(|| {
                FormatError::out_of_bounds(
                    path,
                    format!(
                        "offset {pos} + {rel} points outside buffer of {} bytes",
                        self.data.len()
                    ),
                )
            })
    }

    fn table_at(&'a self, pos: usize, path: &FieldPath<'_>, depth: u32) -> Result<Table<'a>> {
        let (depth_now, limit) = (u64::from(depth), u64::from(MAX_TABLE_DEPTH));
        FormatError::check_limit(path, "table nesting depth", depth_now, limit)?;
        self.charge(1, path)?;
        let soffset = self.read::<i32>(pos, path)?;
        let vtable = i64::try_from(pos)
            .ok()
            .and_then(|p| p.checked_sub(i64::from(soffset)))
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| {
                FormatError::out_of_bounds(
                    path,
                    format!("vtable offset {soffset} of table at {pos} points before the buffer"),
                )
            })?;
        let vtable_len = usize::from(self.read::<u16>(vtable, path)?);
        let object_len = usize::from(self.read::<u16>(vtable + 2, path)?);
        if vtable_len < 4 || vtable_len % 2 != 0 {
            return Err(FormatError::invalid(
                path,
                format!("vtable at {vtable} has invalid length {vtable_len}"),
            ));
        }
        if object_len < 4 {
            return Err(FormatError::invalid(
                path,
                format!("table at {pos} has invalid object length {object_len}"),
            ));
        }
        self.bytes(vtable, vtable_len, path)?;
        self.bytes(pos, object_len, path)?;
        Ok(Table {
            buf: self,
            pos,
            vtable,
            fields: (vtable_len - 4) / 2,
            object_len,
            depth,
        })
    }
}

/// A table inside a [`Buffer`] whose header and vtable have been checked.
#[derive(Clone, Copy)]
pub struct Table<'a> {
    buf: &'a Buffer<'a>,
    pos: usize,
    vtable: usize,
    fields: usize,
    object_len: usize,
    depth: u32,
}

impl<'a> Table<'a> {
    /// Absolute position in the buffer of field `id` holding `size` bytes (checked to
    /// lie inside the table), or `None` when absent; for tools and tests that patch a
    /// field in place.
    pub fn field(&self, id: u16, size: usize, path: &FieldPath<'_>) -> Result<Option<usize>> {
        let id = usize::from(id);
        if id >= self.fields {
            return Ok(None);
        }
        let rel = usize::from(self.buf.read::<u16>(self.vtable + 4 + 2 * id, path)?);
        if rel == 0 {
            return Ok(None);
        }
        if rel + size > self.object_len {
            return Err(FormatError::out_of_bounds(
                path,
                format!(
                    "field at table offset {rel} + {size} bytes exceeds table of {} bytes",
                    self.object_len
                ),
            ));
        }
        Ok(Some(self.pos + rel))
    }

    /// A scalar field, or `default` when absent.
    pub fn scalar<T: Scalar>(&self, id: u16, default: T, path: &FieldPath<'_>) -> Result<T> {
        match self.field(id, T::SIZE, path)? {
            Some(pos) => self.buf.read(pos, path),
            None => Ok(default),
        }
    }

    /// The target of a reference field.
    fn reference(&self, id: u16, path: &FieldPath<'_>) -> Result<Option<usize>> {
        match self.field(id, 4, path)? {
            Some(pos) => self.buf.follow(pos, path).map(Some),
            None => Ok(None),
        }
    }

    /// A sub-table field.
    pub fn table(&self, id: u16, path: &FieldPath<'_>) -> Result<Option<Table<'a>>> {
        match self.reference(id, path)? {
            Some(target) => self.buf.table_at(target, path, self.depth + 1).map(Some),
            None => Ok(None),
        }
    }

    /// A sub-table field that must be present.
    pub fn required_table(&self, id: u16, path: &FieldPath<'_>) -> Result<Table<'a>> {
        self.table(id, path)?.ok_or_else(|| missing(path))
    }

    /// A string field (UTF-8 checked).
    pub fn string(&self, id: u16, path: &FieldPath<'_>) -> Result<Option<&'a str>> {
        let Some(target) = self.reference(id, path)? else {
            return Ok(None);
        };
        let len = self.buf.read::<u32>(target, path)? as usize;
        self.buf.charge(len as u64 + 1, path)?;
        let bytes = self.buf.bytes(target + 4, len, path)?;
        std::str::from_utf8(bytes)
            .map(Some)
            .map_err(|_| FormatError::InvalidUtf8 {
                path: path.to_string(),
            })
    }

    /// A string field that must be present.
    pub fn required_string(&self, id: u16, path: &FieldPath<'_>) -> Result<&'a str> {
        self.string(id, path)?.ok_or_else(|| missing(path))
    }

    /// Position and length of a vector field whose elements are `elem_size` bytes,
    /// checked against `limit` and the buffer, and charged to the budget.
    fn vector_span(
        &self,
        id: u16,
        elem_size: usize,
        limit: usize,
        path: &FieldPath<'_>,
    ) -> Result<Option<(usize, usize)>> {
        let Some(target) = self.reference(id, path)? else {
            return Ok(None);
        };
        let len = self.buf.read::<u32>(target, path)? as usize;
        FormatError::check_limit(path, "vector length", len as u64, limit as u64)?;
        let bytes = len.checked_mul(elem_size).ok_or_else(|| {
            FormatError::out_of_bounds(path, format!("vector of {len} elements overflows"))
        })?;
        self.buf.bytes(target + 4, bytes, path)?;
        self.buf.charge(len as u64, path)?;
        Ok(Some((target + 4, len)))
    }

    /// A vector of scalars.
    pub fn vector<T: Scalar>(
        &self,
        id: u16,
        limit: usize,
        path: &FieldPath<'_>,
    ) -> Result<Option<Vector<'a, T>>> {
        Ok(self
            .vector_span(id, T::SIZE, limit, path)?
            .map(|(start, len)| Vector {
                bytes: self
                    .buf
                    .data
                    .get(start..start + len * T::SIZE)
                    .unwrap_or(&[]),
                start,
                len,
                _elem: PhantomData,
            }))
    }

    /// A vector of scalars, empty when absent.
    pub fn vector_or_empty<T: Scalar>(
        &self,
        id: u16,
        limit: usize,
        path: &FieldPath<'_>,
    ) -> Result<Vector<'a, T>> {
        Ok(self.vector(id, limit, path)?.unwrap_or(Vector {
            bytes: &[],
            start: 0,
            len: 0,
            _elem: PhantomData,
        }))
    }

    /// A vector of tables, empty when absent.
    pub fn tables(&self, id: u16, limit: usize, path: &FieldPath<'_>) -> Result<Tables<'a>> {
        let (start, len) = self.vector_span(id, 4, limit, path)?.unwrap_or((0, 0));
        Ok(Tables {
            buf: self.buf,
            start,
            len,
            depth: self.depth + 1,
        })
    }

    /// A union: the tag at `type_id` and the table at `type_id + 1`.
    pub fn union(&self, type_id: u16, path: &FieldPath<'_>) -> Result<(u8, Option<Table<'a>>)> {
        let tag = self.scalar::<u8>(type_id, 0, path)?;
        let value = self.table(type_id + 1, path)?;
        Ok((tag, value))
    }
}

/// A checked vector of scalars.
#[derive(Clone, Copy)]
pub struct Vector<'a, T: Scalar> {
    bytes: &'a [u8],
    start: usize,
    len: usize,
    _elem: PhantomData<T>,
}

impl<'a, T: Scalar> Vector<'a, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the vector has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements, in order.
    pub fn iter(&self) -> impl Iterator<Item = T> + 'a {
        self.bytes.chunks_exact(T::SIZE).filter_map(T::decode)
    }

    /// Absolute position of the first element and the byte length.
    pub fn byte_span(&self) -> (usize, usize) {
        (self.start, self.bytes.len())
    }

    /// The raw element bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// A checked vector of table offsets; elements are resolved on access.
#[derive(Clone, Copy)]
pub struct Tables<'a> {
    buf: &'a Buffer<'a>,
    start: usize,
    len: usize,
    depth: u32,
}

impl<'a> Tables<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the vector has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The table at `index`; `path` names that element.
    pub fn get(&self, index: usize, path: &FieldPath<'_>) -> Result<Table<'a>> {
        if index >= self.len {
            return Err(FormatError::index(path, index as i64, "vector", self.len));
        }
        let target = self.buf.follow(self.start + 4 * index, path)?;
        self.buf.table_at(target, path, self.depth)
    }
}

fn missing(path: &FieldPath<'_>) -> FormatError {
    FormatError::MissingField {
        path: path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render() {
        let root = FieldPath::Root;
        let plans = root.field("execution_plan");
        let plan = plans.index(0);
        let values = plan.field("values");
        let value = values.index(17);
        let tensor = value.field("tensor");
        let sizes = tensor.field("sizes");
        assert_eq!(
            sizes.index(2).to_string(),
            "execution_plan[0].values[17].tensor.sizes[2]"
        );
        assert_eq!(root.to_string(), "<root>");
    }

    #[test]
    fn tiny_table() {
        // root offset 12 -> table at 12 with soffset 8 -> vtable at 4.
        // vtable: len 6, object len 8, field 0 at +4.
        let mut buf = vec![12, 0, 0, 0];
        buf.extend_from_slice(&[6, 0, 8, 0, 4, 0, 0, 0]); // vtable + pad
        buf.extend_from_slice(&8i32.to_le_bytes());
        buf.extend_from_slice(&42u32.to_le_bytes());
        let b = Buffer::new(&buf);
        let t = b.root(&FieldPath::Root).unwrap();
        assert_eq!(t.scalar::<u32>(0, 0, &FieldPath::Root).unwrap(), 42);
        assert_eq!(t.scalar::<u32>(1, 7, &FieldPath::Root).unwrap(), 7);
        assert!(t.string(0, &FieldPath::Root).is_err());
    }

    #[test]
    fn garbage_never_panics() {
        let mut seed = 1u64;
        for len in 0..64 {
            for _ in 0..200 {
                let data: Vec<u8> = (0..len)
                    .map(|_| {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((seed >> 56) % 24) as u8
                    })
                    .collect();
                let b = Buffer::new(&data);
                if let Ok(t) = b.root(&FieldPath::Root) {
                    for id in 0..4 {
                        let _ = t.scalar::<u64>(id, 0, &FieldPath::Root);
                        let _ = t.string(id, &FieldPath::Root);
                        let _ = t.vector::<i32>(id, 100, &FieldPath::Root);
                        if let Ok(ts) = t.tables(id, 100, &FieldPath::Root) {
                            for i in 0..ts.len() {
                                let _ = ts.get(i, &FieldPath::Root);
                            }
                        }
                    }
                }
            }
        }
    }
}
