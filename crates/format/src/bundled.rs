//! Bundled programs (`.bpte`, ExecuTorch `devtools/bundled_program`): a program with
//! its own test inputs and expected outputs.
//!
//! The file is one FlatBuffer (`bundled_program_schema.fbs`, identifier `BP08`):
//! `BundledProgram { version: uint, method_test_suites: [BundledMethodTestSuite],
//! program: [ubyte] }`, each suite `{ method_name, test_cases: [BundledMethodTestCase] }`,
//! each case `{ inputs: [Value], expected_outputs: [Value] }`, a `Value` a union of
//! `Tensor { scalar_type, sizes, data, dim_order }`, `Int`, `Bool` and `Double`.
//! The wrapped `.pte` is the `program` byte vector, which the writer aligns to 32.
//!
//! Everything is checked at load like a `.pte`: offsets, lengths, the union tags, every
//! tensor's dtype, sizes, `dim_order` and that its data holds the bytes its shape needs
//! (ExecuTorch's runtime accepts a longer buffer and reads its prefix; so does this one).
//! The wrapped program is validated when [`BundledProgramFile::program_file`] loads it.
//!
//! ```
//! use etch_format::{BundledProgramFile, FormatError};
//! let err = BundledProgramFile::from_static(b"\x08\0\0\0ET12").unwrap_err();
//! assert!(matches!(err, FormatError::BadIdentifier { .. }));
//! ```

use std::path::Path;

use etch_memory::SharedBytes;

use crate::error::{FormatError, Result};
use crate::file_bytes::{open_file, slice_range};
use crate::flatbuf::{Buffer, FieldPath, Table};
use crate::limits::{MAX_BUNDLED_TEST_CASES, MAX_BUNDLED_VALUES, MAX_LIST_ITEMS, MAX_PLANS};
use crate::program::check_shape;
use crate::program::header::check_identifier;
use crate::{ByteRange, ProgramFile, ScalarType};

/// The file identifier of a bundled program (bytes 4..8).
pub const BUNDLED_PROGRAM_IDENTIFIER: &str = "BP08";

/// True when `bytes` carry the bundled-program identifier (ExecuTorch's
/// `is_bundled_program`): what `etch run` looks at to unwrap a `.bpte`.
pub fn is_bundled_program(bytes: &[u8]) -> bool {
    bytes.get(4..8) == Some(BUNDLED_PROGRAM_IDENTIFIER.as_bytes())
}

/// Field ids of the schema's tables (their positions in the `.fbs`, a union taking two).
mod id {
    pub const VERSION: u16 = 0;
    pub const SUITES: u16 = 1;
    pub const PROGRAM: u16 = 2;
    pub const SUITE_METHOD_NAME: u16 = 0;
    pub const SUITE_TEST_CASES: u16 = 1;
    pub const CASE_INPUTS: u16 = 0;
    pub const CASE_EXPECTED_OUTPUTS: u16 = 1;
    pub const VALUE_VAL: u16 = 0;
    pub const TENSOR_SCALAR_TYPE: u16 = 0;
    pub const TENSOR_SIZES: u16 = 1;
    pub const TENSOR_DATA: u16 = 2;
    pub const TENSOR_DIM_ORDER: u16 = 3;
    pub const SCALAR: u16 = 0;
}

/// `ValueUnion` tags.
mod tag {
    pub const TENSOR: u8 = 1;
    pub const INT: u8 = 2;
    pub const BOOL: u8 = 3;
    pub const DOUBLE: u8 = 4;
}

/// A bundled tensor: dtype, shape, dim order and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundledTensor {
    /// Element type.
    pub scalar_type: ScalarType,
    /// Sizes, each >= 0.
    pub sizes: Vec<usize>,
    /// A permutation of `0..sizes.len()`: the order of the dims in memory, outermost
    /// first, as in a program's tensors. `data` is laid out in this order.
    pub dim_order: Vec<u8>,
    /// Exactly the tensor's bytes (the prefix of a longer stored buffer), in the file.
    pub data: ByteRange,
}

impl BundledTensor {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }
}

/// One bundled value: a method input or an expected output.
#[derive(Debug, Clone, PartialEq)]
pub enum BundledValue {
    /// A tensor.
    Tensor(BundledTensor),
    /// An `int` (a SymInt or int argument).
    Int(i64),
    /// A `bool`.
    Bool(bool),
    /// A `float` (double).
    Double(f64),
}

/// One test case of a method: inputs, and the outputs they should produce.
#[derive(Debug, Clone, PartialEq)]
pub struct BundledTestCase {
    /// The method's inputs, in order.
    pub inputs: Vec<BundledValue>,
    /// The expected outputs (from eager PyTorch, in the official flow); may be empty,
    /// in which case the case cannot be verified.
    pub expected_outputs: Vec<BundledValue>,
}

/// The test cases of one method.
#[derive(Debug, Clone, PartialEq)]
pub struct BundledMethodTestSuite {
    /// The method tested (unique within the file).
    pub method_name: String,
    /// Its test cases, in file order.
    pub test_cases: Vec<BundledTestCase>,
}

/// A loaded and checked bundled program.
#[derive(Debug, Clone)]
pub struct BundledProgramFile {
    bytes: SharedBytes,
    version: u32,
    suites: Vec<BundledMethodTestSuite>,
    program: ByteRange,
}

impl BundledProgramFile {
    /// Parses and checks a bundled program held in `bytes`.
    pub fn from_bytes(bytes: SharedBytes) -> Result<Self> {
        let data = bytes.as_slice();
        check_identifier(data, BUNDLED_PROGRAM_IDENTIFIER, "a bundled program")?;
        let buffer = Buffer::new(data);
        let root = buffer.root(&FieldPath::Root)?;
        let version = root.scalar::<u32>(id::VERSION, 0, &FieldPath::Root.field("version"))?;
        let pp = FieldPath::Root.field("program");
        let program = root
            .vector::<u8>(id::PROGRAM, usize::MAX, &pp)?
            .ok_or_else(|| FormatError::MissingField {
                path: pp.to_string(),
            })?;
        let (offset, len) = program.byte_span();
        if len == 0 {
            return Err(FormatError::invalid(pp, "the wrapped program is empty"));
        }
        let suites = parse_suites(&root)?;
        Ok(BundledProgramFile {
            version,
            suites,
            program: ByteRange { offset, len },
            bytes,
        })
    }

    /// Parses a bundled program embedded in the binary (`include_bytes!`).
    pub fn from_static(bytes: &'static [u8]) -> Result<Self> {
        Self::from_bytes(SharedBytes::Static(bytes))
    }

    /// Reads the file at `path` into aligned memory and loads it.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_bytes(open_file(path.as_ref(), SharedBytes::read_file)?)
    }

    /// The schema version the writer recorded (not checked: ExecuTorch's runtime
    /// does not check it either).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The test suites, one per method, in file order.
    pub fn method_test_suites(&self) -> &[BundledMethodTestSuite] {
        &self.suites
    }

    /// The suite of method `name`.
    pub fn suite(&self, name: &str) -> Option<&BundledMethodTestSuite> {
        self.suites.iter().find(|s| s.method_name == name)
    }

    /// The file's bytes, which every [`ByteRange`] indexes.
    pub fn bytes(&self) -> &SharedBytes {
        &self.bytes
    }

    /// Where the wrapped `.pte` lies in the file.
    pub fn program_range(&self) -> ByteRange {
        self.program
    }

    /// The wrapped `.pte`'s bytes.
    pub fn program_bytes(&self) -> &[u8] {
        slice_range(&self.bytes, self.program).unwrap_or_default()
    }

    /// The wrapped `.pte` copied into its own aligned buffer (a program's constant
    /// ranges are offsets from its own start, and typed constant reads want the
    /// alignment that [`ProgramFile::read`] gives).
    pub fn program_shared_bytes(&self) -> Result<SharedBytes> {
        etch_memory::AlignedBuffer::copy_from(self.program_bytes(), etch_memory::FILE_ALIGNMENT)
            .map(|b| SharedBytes::Heap(std::sync::Arc::new(b)))
            .map_err(|source| FormatError::Alloc {
                what: "a copy of the bundled program's wrapped .pte",
                source,
            })
    }

    /// The wrapped program, parsed and validated.
    pub fn program_file(&self) -> Result<ProgramFile> {
        ProgramFile::from_bytes(self.program_shared_bytes()?)
    }

    /// The bytes of a tensor of this file.
    pub fn tensor_data(&self, tensor: &BundledTensor) -> &[u8] {
        slice_range(&self.bytes, tensor.data).unwrap_or_default()
    }
}

fn parse_suites(root: &Table<'_>) -> Result<Vec<BundledMethodTestSuite>> {
    let sp = FieldPath::Root.field("method_test_suites");
    let tables = root.tables(id::SUITES, MAX_PLANS, &sp)?;
    let mut suites: Vec<BundledMethodTestSuite> = Vec::with_capacity(tables.len());
    for i in 0..tables.len() {
        let p = sp.index(i);
        let t = tables.get(i, &p)?;
        let np = p.field("method_name");
        let method_name = t.required_string(id::SUITE_METHOD_NAME, &np)?.to_owned();
        if suites.iter().any(|s| s.method_name == method_name) {
            return Err(FormatError::invalid(
                np,
                format!("a second test suite for method {method_name:?}"),
            ));
        }
        let cp = p.field("test_cases");
        let cases = t.tables(id::SUITE_TEST_CASES, MAX_BUNDLED_TEST_CASES, &cp)?;
        let mut test_cases = Vec::with_capacity(cases.len());
        for k in 0..cases.len() {
            let kp = cp.index(k);
            let case = cases.get(k, &kp)?;
            test_cases.push(BundledTestCase {
                inputs: parse_values(&case, id::CASE_INPUTS, &kp.field("inputs"))?,
                expected_outputs: parse_values(
                    &case,
                    id::CASE_EXPECTED_OUTPUTS,
                    &kp.field("expected_outputs"),
                )?,
            });
        }
        suites.push(BundledMethodTestSuite {
            method_name,
            test_cases,
        });
    }
    Ok(suites)
}

fn parse_values(case: &Table<'_>, field: u16, path: &FieldPath<'_>) -> Result<Vec<BundledValue>> {
    let tables = case.tables(field, MAX_BUNDLED_VALUES, path)?;
    (0..tables.len())
        .map(|i| {
            let p = path.index(i);
            parse_value(&tables.get(i, &p)?, &p)
        })
        .collect()
}

fn parse_value(value: &Table<'_>, path: &FieldPath<'_>) -> Result<BundledValue> {
    let vp = path.field("val");
    let (tag, table) = value.union(id::VALUE_VAL, &vp)?;
    let Some(t) = table else {
        return Err(FormatError::MissingField {
            path: vp.to_string(),
        });
    };
    let sp = vp.field("value");
    Ok(match tag {
        tag::TENSOR => BundledValue::Tensor(parse_tensor(&t, &vp)?),
        tag::INT => BundledValue::Int(t.scalar::<i64>(id::SCALAR, 0, &sp)?),
        tag::BOOL => BundledValue::Bool(t.scalar::<bool>(id::SCALAR, false, &sp)?),
        tag::DOUBLE => BundledValue::Double(t.scalar::<f64>(id::SCALAR, 0.0, &sp)?),
        other => {
            return Err(FormatError::UnknownTag {
                path: vp.to_string(),
                what: "bundled value type",
                tag: other.into(),
            });
        }
    })
}

fn parse_tensor(t: &Table<'_>, path: &FieldPath<'_>) -> Result<BundledTensor> {
    let p = path.field("scalar_type");
    let code = t.scalar::<i8>(id::TENSOR_SCALAR_TYPE, 0, &p)?;
    let scalar_type =
        ScalarType::from_code(code.into()).ok_or_else(|| FormatError::UnknownTag {
            path: p.to_string(),
            what: "ScalarType",
            tag: code.into(),
        })?;
    let sp = path.field("sizes");
    let sizes = t.vector_or_empty::<i32>(id::TENSOR_SIZES, MAX_LIST_ITEMS, &sp)?;
    let dp = path.field("dim_order");
    let dim_order: Vec<u8> = t
        .vector_or_empty::<u8>(id::TENSOR_DIM_ORDER, MAX_LIST_ITEMS, &dp)?
        .iter()
        .collect();
    let (sizes, nbytes) =
        check_shape(sizes.len(), sizes.iter(), &dim_order, scalar_type, &sp, &dp)?;
    let ap = path.field("data");
    let (offset, stored) = t
        .vector::<u8>(id::TENSOR_DATA, usize::MAX, &ap)?
        .map_or((0, 0), |v| v.byte_span());
    // `check_shape` bounds the bytes by MAX_TENSOR_BYTES, which fits a usize.
    let len = usize::try_from(nbytes).unwrap_or(usize::MAX);
    if stored < len {
        return Err(FormatError::out_of_bounds(
            ap,
            format!(
                "{stored} bytes of data, but a {scalar_type} tensor of sizes {sizes:?} needs {len}"
            ),
        ));
    }
    Ok(BundledTensor {
        scalar_type,
        sizes,
        dim_order,
        data: ByteRange { offset, len },
    })
}
