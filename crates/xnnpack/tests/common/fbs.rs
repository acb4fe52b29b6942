//! A tiny FlatBuffers writer for synthetic XNNGraph payloads in tests (tables, scalar
//! vectors, table vectors, strings; no vtable sharing).
#![allow(dead_code)]

pub enum F {
    U8(u8),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    Table(T),
    VecU32(Vec<u32>),
    VecTables(Vec<T>),
    Str(String),
}

#[derive(Default)]
pub struct T(pub Vec<(u16, F)>);

impl T {
    pub fn new() -> Self {
        T(Vec::new())
    }
    pub fn f(mut self, id: u16, v: F) -> Self {
        self.0.push((id, v));
        self
    }
}

fn align(buf: &mut Vec<u8>, a: usize) {
    while !buf.len().is_multiple_of(a) {
        buf.push(0);
    }
}

/// Writes `t` at the end of `buf`, returning the table's position.
fn table(buf: &mut Vec<u8>, t: &T) -> usize {
    let n_fields =
        t.0.iter()
            .map(|(id, _)| *id as usize + 1)
            .max()
            .unwrap_or(0);
    // Inline layout: soffset, then each field 8-byte slot (simple, generous).
    let mut offsets = vec![0u16; n_fields];
    let mut at = 4u16;
    for (id, _) in &t.0 {
        offsets[*id as usize] = at;
        at += 8;
    }
    align(buf, 4);
    let vtable = buf.len();
    buf.extend_from_slice(&((4 + 2 * n_fields) as u16).to_le_bytes());
    buf.extend_from_slice(&at.to_le_bytes());
    for o in &offsets {
        buf.extend_from_slice(&o.to_le_bytes());
    }
    align(buf, 8);
    let pos = buf.len();
    buf.extend_from_slice(&((pos - vtable) as i32).to_le_bytes());
    buf.resize(pos + at as usize, 0);
    let mut pending: Vec<(usize, &F)> = Vec::new();
    for (id, v) in &t.0 {
        let p = pos + offsets[*id as usize] as usize;
        match v {
            F::U8(x) => buf[p] = *x,
            F::I16(x) => buf[p..p + 2].copy_from_slice(&x.to_le_bytes()),
            F::U32(x) => buf[p..p + 4].copy_from_slice(&x.to_le_bytes()),
            F::I32(x) => buf[p..p + 4].copy_from_slice(&x.to_le_bytes()),
            F::U64(x) => buf[p..p + 8].copy_from_slice(&x.to_le_bytes()),
            F::F32(x) => buf[p..p + 4].copy_from_slice(&x.to_le_bytes()),
            other => pending.push((p, other)),
        }
    }
    for (p, v) in pending {
        let target = match v {
            F::Table(c) => table(buf, c),
            F::VecU32(items) => {
                align(buf, 4);
                let s = buf.len();
                buf.extend_from_slice(&(items.len() as u32).to_le_bytes());
                for i in items {
                    buf.extend_from_slice(&i.to_le_bytes());
                }
                s
            }
            F::Str(s) => {
                align(buf, 4);
                let at = buf.len();
                buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
                buf.extend_from_slice(s.as_bytes());
                buf.push(0);
                at
            }
            F::VecTables(items) => {
                align(buf, 4);
                let s = buf.len();
                buf.extend_from_slice(&(items.len() as u32).to_le_bytes());
                let slots = buf.len();
                buf.resize(slots + 4 * items.len(), 0);
                for (k, item) in items.iter().enumerate() {
                    let c = table(buf, item);
                    let slot = slots + 4 * k;
                    buf[slot..slot + 4].copy_from_slice(&((c - slot) as u32).to_le_bytes());
                }
                s
            }
            _ => unreachable!(),
        };
        buf[p..p + 4].copy_from_slice(&((target - p) as u32).to_le_bytes());
    }
    pos
}

/// A flatbuffer with identifier `XN00` and root `t`.
pub fn finish(t: &T) -> Vec<u8> {
    let mut buf = vec![0u8; 8];
    buf[4..8].copy_from_slice(b"XN00");
    let root = table(&mut buf, t);
    buf[0..4].copy_from_slice(&(root as u32).to_le_bytes());
    buf
}

/// An `XH00` payload: header, flatbuffer, constant region.
pub fn payload(flatbuffer: &[u8], constants: &[u8]) -> Vec<u8> {
    let fb_off = 32usize;
    let mut fb = flatbuffer.to_vec();
    while !fb.len().is_multiple_of(16) {
        fb.push(0);
    }
    let c_off = fb_off + fb.len();
    let mut out = vec![0u8; fb_off];
    out[4..8].copy_from_slice(b"XH00");
    out[8..10].copy_from_slice(&30u16.to_le_bytes());
    out[10..14].copy_from_slice(&(fb_off as u32).to_le_bytes());
    out[14..18].copy_from_slice(&(flatbuffer.len() as u32).to_le_bytes());
    out[18..22].copy_from_slice(&(c_off as u32).to_le_bytes());
    out[22..30].copy_from_slice(&(constants.len() as u64).to_le_bytes());
    out.extend_from_slice(&fb);
    out.extend_from_slice(constants);
    out
}

/// An fp32 `XValue` (tensor value): `flags` 1 input / 2 output, `cidx` constant index.
pub fn value(id: u32, dims: &[u32], external: Option<(u32, u32)>, cidx: u32) -> T {
    let mut tv = T::new()
        .f(0, F::I16(1))
        .f(1, F::U32(dims.len() as u32))
        .f(2, F::VecU32(dims.to_vec()))
        .f(3, F::U32(cidx))
        .f(6, F::U32(id));
    if let Some((ext, flags)) = external {
        tv = tv.f(4, F::U32(ext)).f(5, F::U32(flags));
    } else {
        tv = tv.f(4, F::U32(u32::MAX));
    }
    T::new().f(0, F::U8(1)).f(1, F::Table(tv))
}

/// An `XNode` with union tag `tag` and body `body`, optional output range.
pub fn node(tag: u8, body: T, range: Option<(f32, f32)>) -> T {
    let mut n = T::new().f(0, F::U8(tag)).f(1, F::Table(body));
    if let Some((lo, hi)) = range {
        n = n.f(3, F::Table(T::new().f(0, F::F32(lo)).f(1, F::F32(hi))));
    }
    n
}

/// A `ConstantDataOffset` inside the header's region.
pub fn constant_at(offset: u64, size: u64) -> T {
    T::new().f(0, F::U64(offset)).f(1, F::U64(size))
}

/// The `XNNGraph`.
pub fn graph(values: Vec<T>, nodes: Vec<T>, num_externs: u32, constants: Vec<T>) -> T {
    let mut c = vec![constant_at(u64::MAX, 0)];
    c.extend(constants);
    T::new()
        .f(0, F::Str("1".into()))
        .f(1, F::VecTables(nodes))
        .f(2, F::VecTables(values))
        .f(3, F::U32(num_externs))
        .f(8, F::VecTables(c))
}

/// A quantized `XValue`: tensor fields as [`value`] with `datatype`, quant params union
/// member `qtag` with table `qparams`.
pub fn qvalue(id: u32, datatype: i16, dims: &[u32], cidx: u32, qtag: u8, qparams: T) -> T {
    let tv = T::new()
        .f(0, F::I16(datatype))
        .f(1, F::U32(dims.len() as u32))
        .f(2, F::VecU32(dims.to_vec()))
        .f(3, F::U32(cidx))
        .f(4, F::U32(u32::MAX))
        .f(6, F::U32(id));
    let q = T::new()
        .f(0, F::Table(tv))
        .f(1, F::U8(qtag))
        .f(2, F::Table(qparams));
    T::new().f(0, F::U8(2)).f(1, F::Table(q))
}
