//! Test-only `.ptd` (FlatTensor) descriptions.

use super::flatbuffers::{Field, Obj, TableB, Writer};
use super::program::{SEGMENT_ALIGN, lay_out_segments};

/// One named-data entry: key, segment index, optional (dtype, sizes, dim_order).
#[derive(Clone, Debug)]
pub struct EntryB {
    pub key: String,
    pub segment_index: u32,
    pub layout: Option<(i8, Vec<i32>, Vec<u8>)>,
}

/// A `.ptd` description.
#[derive(Clone, Debug, Default)]
pub struct DataFileB {
    pub version: u32,
    pub segments: Vec<Vec<u8>>,
    /// Overrides the `(offset, size)` entries written for `segments`.
    pub segment_table: Option<Vec<(u64, u64)>>,
    pub entries: Vec<EntryB>,
}

const HEADER_LEN: usize = 40;
const PADDED_HEADER_LEN: usize = 48;

impl DataFileB {
    /// The file bytes, laid out like ExecuTorch's FlatTensorSerializer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (data, table) = lay_out_segments(&self.segments);
        let table = self.segment_table.clone().unwrap_or(table);
        let root = TableB::new()
            .f(0, Field::U32(self.version))
            .tables(
                1,
                table
                    .iter()
                    .map(|(o, s)| TableB::new().f(0, Field::U64(*o)).f(1, Field::U64(*s)))
                    .collect(),
            )
            .tables(
                2,
                self.entries
                    .iter()
                    .map(|e| {
                        let mut t = TableB::new()
                            .str(0, &e.key)
                            .f(1, Field::U32(e.segment_index));
                        if let Some((st, sizes, dims)) = &e.layout {
                            t = t.table(
                                2,
                                TableB::new()
                                    .f(0, Field::I8(*st))
                                    .f(1, Field::Obj(Obj::I32s(sizes.clone())))
                                    .f(2, Field::Obj(Obj::Bytes(dims.clone()))),
                            );
                        }
                        t
                    })
                    .collect(),
            );
        let mut out = Writer::new(b"FT01", &[0u8; PADDED_HEADER_LEN]).finish(&root);
        let flatbuffer_size = out.len() - PADDED_HEADER_LEN;
        while !out.len().is_multiple_of(SEGMENT_ALIGN) {
            out.push(0);
        }
        let base = out.len();
        out.extend_from_slice(&data);
        let mut h = Vec::new();
        h.extend_from_slice(b"FH01");
        h.extend_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        h.extend_from_slice(&(PADDED_HEADER_LEN as u64).to_le_bytes());
        h.extend_from_slice(&(flatbuffer_size as u64).to_le_bytes());
        h.extend_from_slice(&(base as u64).to_le_bytes());
        h.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out[8..8 + HEADER_LEN].copy_from_slice(&h);
        out
    }
}

/// Two tensors and an opaque blob.
pub fn sample_data_file() -> DataFileB {
    DataFileB {
        version: 0,
        segments: vec![
            (1..=6).flat_map(|v| (v as f32).to_le_bytes()).collect(),
            vec![1, 2, 3],
        ],
        segment_table: None,
        entries: vec![
            EntryB {
                key: "w".into(),
                segment_index: 0,
                layout: Some((6, vec![2, 3], vec![0, 1])),
            },
            EntryB {
                key: "blob".into(),
                segment_index: 1,
                layout: None,
            },
        ],
    }
}
