//! Test-only descriptions of `.pte` programs (raw, unchecked field values, so that
//! tests can write invalid ones) and their serialisation with the test writer.

use super::flatbuffers::{Field, Obj, TableB, Writer};

/// AllocationDetails.
#[derive(Clone, Debug)]
pub struct Alloc {
    pub memory_id: u32,
    pub low: u32,
    pub high: u32,
}

/// ExtraTensorInfo.
#[derive(Clone, Debug, Default)]
pub struct Extra {
    pub mutable_data_segments_idx: u64,
    pub fqn: Option<String>,
    pub location: i8,
}

/// Tensor.
#[derive(Clone, Debug)]
pub struct TensorB {
    pub scalar_type: i8,
    pub storage_offset: i32,
    pub sizes: Option<Vec<i32>>,
    pub dim_order: Option<Vec<u8>>,
    pub data_buffer_idx: u32,
    pub allocation: Option<Alloc>,
    pub shape_dynamism: i8,
    pub extra: Option<Extra>,
}

impl TensorB {
    /// A contiguous f32 tensor of `sizes`, bound at run time.
    pub fn f32(sizes: &[i32]) -> Self {
        TensorB {
            scalar_type: 6,
            storage_offset: 0,
            sizes: Some(sizes.to_vec()),
            dim_order: Some((0..sizes.len() as u8).collect()),
            data_buffer_idx: 0,
            allocation: None,
            shape_dynamism: 0,
            extra: None,
        }
    }

    /// Placed in planned memory `memory_id` at `offset`.
    pub fn planned(mut self, memory_id: u32, offset: u32) -> Self {
        self.allocation = Some(Alloc {
            memory_id,
            low: offset,
            high: 0,
        });
        self
    }

    /// A constant with `data_buffer_idx`.
    pub fn constant(mut self, idx: u32) -> Self {
        self.data_buffer_idx = idx;
        self
    }

    fn table(&self) -> TableB {
        let mut t = TableB::new()
            .f(0, Field::I8(self.scalar_type))
            .f(1, Field::I32(self.storage_offset))
            .opt(5, Some(Field::U32(self.data_buffer_idx)))
            .f(8, Field::I8(self.shape_dynamism));
        if let Some(s) = &self.sizes {
            t = t.f(2, Field::Obj(Obj::I32s(s.clone())));
        }
        if let Some(d) = &self.dim_order {
            t = t.f(3, Field::Obj(Obj::Bytes(d.clone())));
        }
        if let Some(a) = &self.allocation {
            t = t.table(
                6,
                TableB::new()
                    .f(0, Field::U32(a.memory_id))
                    .f(1, Field::U32(a.low))
                    .f(2, Field::U32(a.high)),
            );
        }
        if let Some(e) = &self.extra {
            let mut x = TableB::new()
                .f(0, Field::U64(e.mutable_data_segments_idx))
                .f(2, Field::I8(e.location));
            if let Some(n) = &e.fqn {
                x = x.str(1, n);
            }
            t = t.table(9, x);
        }
        t
    }
}

/// EValue.
#[derive(Clone, Debug)]
pub enum ValueB {
    Null,
    Int(i64),
    Bool(bool),
    Double(f64),
    Str(String),
    Tensor(TensorB),
    IntList(Vec<i64>),
    DoubleList(Vec<f64>),
    BoolList(Vec<bool>),
    TensorList(Vec<i32>),
    OptionalTensorList(Vec<i32>),
    /// Any tag with an optional raw table.
    Raw(u8, Option<TableB>),
}

impl ValueB {
    fn table(&self) -> TableB {
        let (tag, val): (u8, Option<TableB>) = match self {
            ValueB::Null => (1, Some(TableB::new())),
            ValueB::Int(v) => (2, Some(TableB::new().f(0, Field::I64(*v)))),
            ValueB::Bool(v) => (3, Some(TableB::new().f(0, Field::Bool(*v)))),
            ValueB::Double(v) => (4, Some(TableB::new().f(0, Field::F64(*v)))),
            ValueB::Tensor(t) => (5, Some(t.table())),
            ValueB::Str(s) => (6, Some(TableB::new().str(0, s))),
            ValueB::IntList(v) => (
                7,
                Some(TableB::new().f(0, Field::Obj(Obj::I64s(v.clone())))),
            ),
            ValueB::DoubleList(v) => (
                8,
                Some(TableB::new().f(0, Field::Obj(Obj::F64s(v.clone())))),
            ),
            ValueB::BoolList(v) => (
                9,
                Some(TableB::new().f(0, Field::Obj(Obj::Bools(v.clone())))),
            ),
            ValueB::TensorList(v) => (
                10,
                Some(TableB::new().f(0, Field::Obj(Obj::I32s(v.clone())))),
            ),
            ValueB::OptionalTensorList(v) => (
                11,
                Some(TableB::new().f(0, Field::Obj(Obj::I32s(v.clone())))),
            ),
            ValueB::Raw(tag, t) => (*tag, t.clone()),
        };
        let mut t = TableB::new().f(0, Field::U8(tag));
        if let Some(v) = val {
            t = t.table(1, v);
        }
        t
    }
}

/// Instruction.
#[derive(Clone, Debug)]
pub enum InstrB {
    Kernel(i32, Vec<i32>),
    Delegate(i32, Vec<i32>),
    Move(i32, i32),
    JumpFalse(i32, i32),
    Free(i32),
    Raw(u8, Option<TableB>),
}

impl InstrB {
    fn table(&self) -> TableB {
        let (tag, args) = match self {
            InstrB::Kernel(op, args) => (
                1,
                Some(
                    TableB::new()
                        .f(0, Field::I32(*op))
                        .f(1, Field::Obj(Obj::I32s(args.clone()))),
                ),
            ),
            InstrB::Delegate(d, args) => (
                2,
                Some(
                    TableB::new()
                        .f(0, Field::I32(*d))
                        .f(1, Field::Obj(Obj::I32s(args.clone()))),
                ),
            ),
            InstrB::Move(a, b) => (
                3,
                Some(TableB::new().f(0, Field::I32(*a)).f(1, Field::I32(*b))),
            ),
            InstrB::JumpFalse(a, b) => (
                4,
                Some(TableB::new().f(0, Field::I32(*a)).f(1, Field::I32(*b))),
            ),
            InstrB::Free(a) => (5, Some(TableB::new().f(0, Field::I32(*a)))),
            InstrB::Raw(tag, t) => (*tag, t.clone()),
        };
        let mut t = TableB::new().f(0, Field::U8(tag));
        if let Some(a) = args {
            t = t.table(1, a);
        }
        t
    }
}

/// Chain.
#[derive(Clone, Debug, Default)]
pub struct ChainB {
    pub inputs: Vec<i32>,
    pub outputs: Vec<i32>,
    pub instructions: Vec<InstrB>,
}

/// BackendDelegate.
#[derive(Clone, Debug)]
pub struct DelegateB {
    pub id: String,
    pub location: i8,
    pub index: u32,
    pub specs: Vec<(String, Vec<u8>)>,
}

/// ExecutionPlan.
#[derive(Clone, Debug, Default)]
pub struct PlanB {
    pub name: Option<Vec<u8>>,
    pub values: Vec<ValueB>,
    pub inputs: Vec<i32>,
    pub outputs: Vec<i32>,
    pub chains: Vec<ChainB>,
    pub operators: Vec<(Vec<u8>, String)>,
    pub delegates: Vec<DelegateB>,
    pub non_const_buffer_sizes: Vec<i64>,
}

impl PlanB {
    fn table(&self) -> TableB {
        let mut t = TableB::new();
        if let Some(n) = &self.name {
            t = t.f(0, Field::Obj(Obj::Str(n.clone())));
        }
        t.tables(2, self.values.iter().map(ValueB::table).collect())
            .f(3, Field::Obj(Obj::I32s(self.inputs.clone())))
            .f(4, Field::Obj(Obj::I32s(self.outputs.clone())))
            .tables(
                5,
                self.chains
                    .iter()
                    .map(|c| {
                        TableB::new()
                            .f(0, Field::Obj(Obj::I32s(c.inputs.clone())))
                            .f(1, Field::Obj(Obj::I32s(c.outputs.clone())))
                            .tables(2, c.instructions.iter().map(InstrB::table).collect())
                    })
                    .collect(),
            )
            .tables(
                6,
                self.operators
                    .iter()
                    .map(|(n, o)| {
                        TableB::new()
                            .f(0, Field::Obj(Obj::Str(n.clone())))
                            .str(1, o)
                    })
                    .collect(),
            )
            .tables(
                7,
                self.delegates
                    .iter()
                    .map(|d| {
                        TableB::new()
                            .str(0, &d.id)
                            .table(
                                1,
                                TableB::new()
                                    .f(0, Field::I8(d.location))
                                    .f(1, Field::U32(d.index)),
                            )
                            .tables(
                                2,
                                d.specs
                                    .iter()
                                    .map(|(k, v)| {
                                        TableB::new()
                                            .str(0, k)
                                            .f(1, Field::Obj(Obj::Bytes(v.clone())))
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            )
            .f(
                8,
                Field::Obj(Obj::I64s(self.non_const_buffer_sizes.clone())),
            )
    }
}

/// Program, plus the file layout around it.
#[derive(Clone, Debug, Default)]
pub struct ProgramB {
    pub version: u32,
    pub plans: Vec<PlanB>,
    pub constant_buffers: Vec<Vec<u8>>,
    pub delegate_data: Vec<Vec<u8>>,
    /// Segment contents, laid out after the program data at 16-byte alignment.
    pub segments: Vec<Vec<u8>>,
    /// Overrides the `(offset, size)` entries written for `segments`.
    pub segment_table: Option<Vec<(u64, u64)>>,
    pub constant_segment: Option<(u32, Vec<u64>)>,
    pub mutable_data_segments: Vec<(u32, Vec<u64>)>,
    pub named_data: Vec<(String, u32)>,
    /// Write an `eh00` header even without segments.
    pub extended_header: bool,
}

pub const SEGMENT_ALIGN: usize = 16;

/// The segments laid end to end, each starting at a multiple of [`SEGMENT_ALIGN`], and
/// the `(offset, size)` table that finds them.
pub fn lay_out_segments(segments: &[Vec<u8>]) -> (Vec<u8>, Vec<(u64, u64)>) {
    let mut data = Vec::new();
    let mut table = Vec::new();
    for s in segments {
        while data.len() % SEGMENT_ALIGN != 0 {
            data.push(0);
        }
        table.push((data.len() as u64, s.len() as u64));
        data.extend_from_slice(s);
    }
    (data, table)
}

impl ProgramB {
    fn table(&self, segment_table: &[(u64, u64)]) -> TableB {
        let mut t = TableB::new()
            .f(0, Field::U32(self.version))
            .tables(1, self.plans.iter().map(PlanB::table).collect());
        if !self.constant_buffers.is_empty() {
            t = t.tables(
                2,
                self.constant_buffers
                    .iter()
                    .map(|b| TableB::new().f(0, Field::Obj(Obj::Bytes(b.clone()))))
                    .collect(),
            );
        }
        if !self.delegate_data.is_empty() {
            t = t.tables(
                3,
                self.delegate_data
                    .iter()
                    .map(|b| TableB::new().f(0, Field::Obj(Obj::Bytes(b.clone()))))
                    .collect(),
            );
        }
        if !segment_table.is_empty() {
            t = t.tables(
                4,
                segment_table
                    .iter()
                    .map(|(o, s)| TableB::new().f(0, Field::U64(*o)).f(1, Field::U64(*s)))
                    .collect(),
            );
        }
        if let Some((idx, offsets)) = &self.constant_segment {
            t = t.table(
                5,
                TableB::new()
                    .f(0, Field::U32(*idx))
                    .f(1, Field::Obj(Obj::U64s(offsets.clone()))),
            );
        }
        if !self.mutable_data_segments.is_empty() {
            t = t.tables(
                6,
                self.mutable_data_segments
                    .iter()
                    .map(|(idx, offsets)| {
                        TableB::new()
                            .f(0, Field::U32(*idx))
                            .f(1, Field::Obj(Obj::U64s(offsets.clone())))
                    })
                    .collect(),
            );
        }
        if !self.named_data.is_empty() {
            t = t.tables(
                7,
                self.named_data
                    .iter()
                    .map(|(k, i)| TableB::new().str(0, k).f(1, Field::U32(*i)))
                    .collect(),
            );
        }
        t
    }

    /// The `.pte` bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Segment layout relative to the segment base.
        let (data, table) = lay_out_segments(&self.segments);
        let table = self.segment_table.clone().unwrap_or(table);
        let with_header = self.extended_header || !self.segments.is_empty();
        let header = if with_header {
            vec![0u8; 32]
        } else {
            Vec::new()
        };
        let mut out = Writer::new(b"ET12", &header).finish(&self.table(&table));
        if with_header {
            let program_size = out.len();
            let mut base = 0;
            if !self.segments.is_empty() {
                while !out.len().is_multiple_of(SEGMENT_ALIGN) {
                    out.push(0);
                }
                base = out.len();
                out.extend_from_slice(&data);
            }
            let mut h = Vec::new();
            h.extend_from_slice(b"eh00");
            h.extend_from_slice(&32u32.to_le_bytes());
            h.extend_from_slice(&(program_size as u64).to_le_bytes());
            h.extend_from_slice(&(base as u64).to_le_bytes());
            h.extend_from_slice(&(data.len() as u64).to_le_bytes());
            out[8..40].copy_from_slice(&h);
        }
        out
    }
}

/// f32 little-endian bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A small valid program exercising most features:
///
/// * `forward`: `out = aten::add.out(x, w, alpha=1, out)` where `x` (value 0) is an
///   input in planned memory, `w` (value 1) a constant [2, 3] f32 from the constant
///   segment, value 2 an Int alpha, value 3 the planned output; plus list values, a
///   delegate with inline payload, a mutable planned tensor with initial state, and
///   jump/move/free instructions.
/// * `get_n`: a metadata method returning Int 7.
pub fn sample_program() -> ProgramB {
    let weights = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let mut segment0 = weights.clone();
    segment0.extend_from_slice(&f32_bytes(&[0.5; 2]));
    let state = f32_bytes(&[9.0, 8.0]);
    let forward = PlanB {
        name: Some(b"forward".to_vec()),
        values: vec![
            /* 0 */ ValueB::Tensor(TensorB::f32(&[2, 3]).planned(1, 0)),
            /* 1 */ ValueB::Tensor(TensorB::f32(&[2, 3]).constant(1)),
            /* 2 */ ValueB::Int(1),
            /* 3 */ ValueB::Tensor(TensorB::f32(&[2, 3]).planned(1, 24)),
            /* 4 */ ValueB::IntList(vec![2, 2]),
            /* 5 */ ValueB::TensorList(vec![0, 1]),
            /* 6 */ ValueB::OptionalTensorList(vec![0, -1, 7]),
            /* 7 */ ValueB::Null,
            /* 8 */ ValueB::Bool(true),
            /* 9 */ ValueB::Double(0.5),
            /* 10 */ ValueB::Str("hello".into()),
            /* 11 */ ValueB::DoubleList(vec![1.5, 2.5]),
            /* 12 */ ValueB::BoolList(vec![true, false]),
            /* 13 */ ValueB::Tensor(TensorB::f32(&[2]).planned(1, 48).constant(1)),
            /* 14 */ ValueB::Tensor(TensorB::f32(&[2]).constant(2)),
        ],
        inputs: vec![0],
        outputs: vec![3],
        chains: vec![ChainB {
            inputs: vec![0],
            outputs: vec![3],
            instructions: vec![
                InstrB::Kernel(0, vec![0, 1, 2, 3, 3]),
                InstrB::JumpFalse(8, 3),
                InstrB::Move(3, 0),
                InstrB::Delegate(0, vec![0, 3]),
                InstrB::Free(0),
            ],
        }],
        operators: vec![
            (b"aten::add".to_vec(), "out".into()),
            (b"aten::mul".to_vec(), "".into()),
        ],
        delegates: vec![DelegateB {
            id: "TestBackend".into(),
            location: 0,
            index: 0,
            specs: vec![("level".into(), vec![1, 2])],
        }],
        non_const_buffer_sizes: vec![0, 64],
    };
    let get_n = PlanB {
        name: Some(b"get_n".to_vec()),
        values: vec![ValueB::Int(7)],
        inputs: vec![],
        outputs: vec![0],
        chains: vec![ChainB::default()],
        operators: vec![],
        delegates: vec![],
        non_const_buffer_sizes: vec![0],
    };
    ProgramB {
        version: 0,
        plans: vec![forward, get_n],
        constant_buffers: vec![],
        delegate_data: vec![vec![0xAB; 5]],
        segments: vec![segment0, state, vec![7u8; 3]],
        segment_table: None,
        constant_segment: Some((0, vec![0, 0, 24])),
        mutable_data_segments: vec![(1, vec![0, 0])],
        named_data: vec![("weights_key".into(), 2)],
        extended_header: true,
    }
}

/// The `forward` plan of a program description.
pub fn forward(p: &mut ProgramB) -> &mut PlanB {
    &mut p.plans[0]
}

/// Value `i` of `forward`, which must be a tensor.
pub fn tensor(p: &mut ProgramB, i: usize) -> &mut TensorB {
    match &mut p.plans[0].values[i] {
        ValueB::Tensor(t) => t,
        other => panic!("value {i} is {other:?}"),
    }
}
