//! A tiny FlatBuffers writer, for tests only.
//!
//! It writes front to back: a table's vtable, then the table, then the objects its
//! reference fields point to (uoffsets are unsigned, so targets must come after
//! the field), patching each reference once its target is placed. Objects are
//! aligned like a real builder would (8-byte scalars on 8, byte vectors on 16) so
//! that the output looks like what flatc or the Python builder produces.

/// A field value.
#[derive(Clone, Debug)]
pub enum Field {
    U8(u8),
    I8(i8),
    Bool(bool),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F64(f64),
    Obj(Obj),
}

/// A referenced object.
#[derive(Clone, Debug)]
pub enum Obj {
    Table(TableB),
    Str(Vec<u8>),
    Bytes(Vec<u8>),
    I32s(Vec<i32>),
    I64s(Vec<i64>),
    U64s(Vec<u64>),
    F64s(Vec<f64>),
    Bools(Vec<bool>),
    Tables(Vec<TableB>),
}

/// A table under construction: `(field id, value)` pairs.
#[derive(Clone, Debug, Default)]
pub struct TableB {
    pub fields: Vec<(u16, Field)>,
}

impl TableB {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds field `id`.
    pub fn f(mut self, id: u16, value: Field) -> Self {
        self.fields.push((id, value));
        self
    }

    /// Adds field `id` when `value` is `Some`.
    pub fn opt(self, id: u16, value: Option<Field>) -> Self {
        match value {
            Some(v) => self.f(id, v),
            None => self,
        }
    }

    pub fn table(self, id: u16, t: TableB) -> Self {
        self.f(id, Field::Obj(Obj::Table(t)))
    }

    pub fn str(self, id: u16, s: &str) -> Self {
        self.f(id, Field::Obj(Obj::Str(s.as_bytes().to_vec())))
    }

    pub fn tables(self, id: u16, t: Vec<TableB>) -> Self {
        self.f(id, Field::Obj(Obj::Tables(t)))
    }
}

fn field_size(f: &Field) -> usize {
    match f {
        Field::U8(_) | Field::I8(_) | Field::Bool(_) => 1,
        Field::I32(_) | Field::U32(_) | Field::Obj(_) => 4,
        Field::I64(_) | Field::U64(_) | Field::F64(_) => 8,
    }
}

/// The writer.
pub struct Writer {
    pub out: Vec<u8>,
}

impl Writer {
    /// Starts a buffer with a root-offset placeholder and `identifier`, followed by
    /// `header` (already padded by the caller).
    pub fn new(identifier: &[u8; 4], header: &[u8]) -> Self {
        let mut out = vec![0u8; 4];
        out.extend_from_slice(identifier);
        out.extend_from_slice(header);
        Writer { out }
    }

    fn pad_to(&mut self, align: usize, extra: usize) {
        while !(self.out.len() + extra).is_multiple_of(align) {
            self.out.push(0);
        }
    }

    fn patch_u32(&mut self, pos: usize, value: u32) {
        self.out[pos..pos + 4].copy_from_slice(&value.to_le_bytes());
    }

    /// Writes `root` and points the root offset at it; returns the buffer.
    pub fn finish(mut self, root: &TableB) -> Vec<u8> {
        let pos = self.table(root);
        self.patch_u32(0, pos as u32);
        self.out
    }

    /// Writes a table and everything it references; returns the table position.
    pub fn table(&mut self, t: &TableB) -> usize {
        // Field layout: after the 4-byte soffset, largest fields first.
        let mut order: Vec<usize> = (0..t.fields.len()).collect();
        order.sort_by_key(|i| std::cmp::Reverse(field_size(&t.fields[*i].1)));
        let mut rel = vec![0usize; t.fields.len()];
        let mut cursor = 4usize;
        for i in &order {
            let size = field_size(&t.fields[*i].1);
            while !cursor.is_multiple_of(size) {
                cursor += 1;
            }
            rel[*i] = cursor;
            cursor += size;
        }
        let object_len = cursor;
        let n_ids = t
            .fields
            .iter()
            .map(|(id, _)| *id as usize + 1)
            .max()
            .unwrap_or(0);
        // Vtable.
        self.pad_to(2, 0);
        let vtable_len = 4 + 2 * n_ids;
        // Place the table 8-aligned right after the vtable.
        let mut vtable_pos = self.out.len();
        while !(vtable_pos + vtable_len).is_multiple_of(8) {
            vtable_pos += 2;
        }
        self.out.resize(vtable_pos, 0);
        let mut entries = vec![0u16; n_ids];
        for (i, (id, _)) in t.fields.iter().enumerate() {
            entries[*id as usize] = rel[i] as u16;
        }
        self.out
            .extend_from_slice(&(vtable_len as u16).to_le_bytes());
        self.out
            .extend_from_slice(&(object_len as u16).to_le_bytes());
        for e in entries {
            self.out.extend_from_slice(&e.to_le_bytes());
        }
        let pos = self.out.len();
        self.out.resize(pos + object_len, 0);
        let soffset = (pos - vtable_pos) as i32;
        self.out[pos..pos + 4].copy_from_slice(&soffset.to_le_bytes());
        let mut refs = Vec::new();
        for (i, (_, f)) in t.fields.iter().enumerate() {
            let at = pos + rel[i];
            let bytes: Vec<u8> = match f {
                Field::U8(v) => vec![*v],
                Field::I8(v) => v.to_le_bytes().to_vec(),
                Field::Bool(v) => vec![*v as u8],
                Field::I32(v) => v.to_le_bytes().to_vec(),
                Field::U32(v) => v.to_le_bytes().to_vec(),
                Field::I64(v) => v.to_le_bytes().to_vec(),
                Field::U64(v) => v.to_le_bytes().to_vec(),
                Field::F64(v) => v.to_le_bytes().to_vec(),
                Field::Obj(o) => {
                    refs.push((at, o));
                    vec![0; 4]
                }
            };
            self.out[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        for (slot, obj) in refs {
            let target = self.obj(obj);
            self.patch_u32(slot, (target - slot) as u32);
        }
        pos
    }

    fn scalar_vector(&mut self, len: usize, elem_align: usize, bytes: &[u8]) -> usize {
        self.pad_to(elem_align.max(4), 4);
        let pos = self.out.len();
        self.out.extend_from_slice(&(len as u32).to_le_bytes());
        self.out.extend_from_slice(bytes);
        pos
    }

    /// Writes an object; returns its position.
    pub fn obj(&mut self, o: &Obj) -> usize {
        match o {
            Obj::Table(t) => self.table(t),
            Obj::Str(s) => {
                let pos = self.scalar_vector(s.len(), 4, s);
                self.out.push(0);
                pos
            }
            Obj::Bytes(b) => self.scalar_vector(b.len(), 16, b),
            Obj::Bools(b) => {
                let bytes: Vec<u8> = b.iter().map(|v| *v as u8).collect();
                self.scalar_vector(b.len(), 4, &bytes)
            }
            Obj::I32s(v) => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                self.scalar_vector(v.len(), 4, &bytes)
            }
            Obj::I64s(v) => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                self.scalar_vector(v.len(), 8, &bytes)
            }
            Obj::U64s(v) => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                self.scalar_vector(v.len(), 8, &bytes)
            }
            Obj::F64s(v) => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                self.scalar_vector(v.len(), 8, &bytes)
            }
            Obj::Tables(ts) => {
                self.pad_to(4, 0);
                let pos = self.out.len();
                self.out.extend_from_slice(&(ts.len() as u32).to_le_bytes());
                let slots = self.out.len();
                self.out.resize(slots + 4 * ts.len(), 0);
                for (i, t) in ts.iter().enumerate() {
                    let target = self.table(t);
                    let slot = slots + 4 * i;
                    self.patch_u32(slot, (target - slot) as u32);
                }
                pos
            }
        }
    }
}
