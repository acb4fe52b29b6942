//! [`ProgramFile`]: a `.pte` file's bytes plus its validated model.

use std::path::Path;
use std::sync::OnceLock;

use etch_memory::SharedBytes;

use crate::error::{FormatError, Result};
use crate::file_bytes::{open_file, slice_range};
use crate::program::header::parse_layout;
use crate::program::model::*;
use crate::program::parse::{PlanHeader, parse_plan_at, parse_program};
use crate::program::validate::{validate_plan, validate_program};

/// A loaded `.pte` program: its program-level tables validated, each method
/// validated when it is loaded.
///
/// As ExecuTorch's `Program::load` and `Program::load_method`, loading parses the
/// headers, segments, constant, mutable and named data tables into the owned
/// [`Program`] model and checks them, and reads the name of every execution plan;
/// [`ProgramFile::load_plan`] parses and checks one plan (every index, offset and
/// length, dtype, shape and planned memory placement: see the crate docs) the first
/// time it is asked for, and keeps it. A method etch cannot read is an error of that
/// method alone: the others load. Tensor bytes are not copied: accessors return
/// [`ByteRange`]s, absolute offsets into [`ProgramFile::bytes`], so the runtime can
/// bind constants zero-copy.
///
/// ```
/// use etch_format::{FormatError, ProgramFile};
/// // 8 bytes: a root offset and the identifier, but no tables.
/// let err = ProgramFile::from_static(b"\x08\0\0\0ET12").unwrap_err();
/// assert!(matches!(err, FormatError::OutOfBounds { .. }));
/// ```
#[derive(Debug, Clone)]
pub struct ProgramFile {
    bytes: SharedBytes,
    header: Option<ExtendedHeader>,
    program_size: usize,
    program: Program,
    /// One per execution plan, in file order.
    methods: Vec<MethodSlot>,
}

/// An execution plan as the program's load leaves it: named, parsed on first use.
#[derive(Debug, Clone)]
struct MethodSlot {
    header: PlanHeader,
    /// The validated plan, once loaded. A plan that fails is not kept: asking again
    /// parses it again and gives the same error (a rare, cheap path).
    plan: OnceLock<ExecutionPlan>,
}

impl ProgramFile {
    /// Parses and validates the program-level tables of a program held in `bytes`
    /// (methods are validated when loaded: [`ProgramFile::load_plan`]).
    pub fn from_bytes(bytes: SharedBytes) -> Result<Self> {
        let data = bytes.as_slice();
        let layout = parse_layout(data)?;
        let fb = data.get(..layout.program_size).unwrap_or(data);
        let (program, plans) = parse_program(fb, layout.segment_base_offset, data.len())?;
        validate_program(&program)?;
        let methods = plans
            .into_iter()
            .map(|header| MethodSlot {
                header,
                plan: OnceLock::new(),
            })
            .collect();
        Ok(ProgramFile {
            header: layout.header,
            program_size: layout.program_size,
            program,
            methods,
            bytes,
        })
    }

    /// Parses a program embedded in the binary (`include_bytes!`).
    ///
    /// The reader itself needs no alignment, but a runtime that reinterprets
    /// constant bytes as typed slices wants 16-byte alignment, which
    /// `include_bytes!` does not guarantee; [`ProgramFile::read`] does.
    pub fn from_static(bytes: &'static [u8]) -> Result<Self> {
        Self::from_bytes(SharedBytes::Static(bytes))
    }

    /// Reads the file at `path` into aligned memory and loads it.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_bytes(open_file(path.as_ref(), SharedBytes::read_file)?)
    }

    /// Reads the file at `path` into memory backed by transparent huge pages where the
    /// OS offers them (see [`SharedBytes::read_file_huge_pages`]) and loads it.
    pub fn read_huge_pages(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_bytes(open_file(path.as_ref(), SharedBytes::read_file_huge_pages)?)
    }

    /// Memory-maps the file at `path` (and `mlock`s it when `lock`) and loads it.
    pub fn map(path: impl AsRef<Path>, lock: bool) -> Result<Self> {
        Self::from_bytes(open_file(path.as_ref(), |p| {
            SharedBytes::map_file(p, lock)
        })?)
    }

    /// The validated program-level model (the plans are loaded one by one:
    /// [`ProgramFile::load_plan`]).
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The file's bytes, which every [`ByteRange`] indexes.
    pub fn bytes(&self) -> &SharedBytes {
        &self.bytes
    }

    /// The bytes of `range`, or `None` if it does not lie inside the file (ranges
    /// returned by this type always do).
    pub fn slice(&self, range: ByteRange) -> Option<&[u8]> {
        slice_range(&self.bytes, range)
    }

    /// The `eh00` extended header, if the file has one.
    pub fn header(&self) -> Option<&ExtendedHeader> {
        self.header.as_ref()
    }

    /// Bytes of FlatBuffers program data at the start of the file.
    pub fn program_size(&self) -> usize {
        self.program_size
    }

    /// The validated execution plan of method `name` (the first of that name), parsed
    /// and checked on the first call and kept.
    ///
    /// Fails with [`FormatError::NotFound`] when there is no such method, and with the
    /// error of the first bad field (a path under `execution_plan[i]`) when the plan
    /// is malformed; other methods are unaffected.
    pub fn load_plan(&self, name: &str) -> Result<&ExecutionPlan> {
        let index = self
            .methods
            .iter()
            .position(|m| m.header.name == name)
            .ok_or_else(|| FormatError::NotFound {
                path: "execution_plan".into(),
                what: format!("method {name:?}"),
            })?;
        self.load_plan_at(index)
    }

    /// Loads execution plan `index` (see [`ProgramFile::load_plan`]).
    fn load_plan_at(&self, index: usize) -> Result<&ExecutionPlan> {
        let slot = self.methods.get(index).ok_or_else(|| {
            FormatError::index(
                "execution_plan",
                index as i64,
                "execution_plan",
                self.methods.len(),
            )
        })?;
        if let Some(plan) = slot.plan.get() {
            return Ok(plan);
        }
        let data = self.bytes.as_slice();
        let fb = data.get(..self.program_size).unwrap_or(data);
        let plan = parse_plan_at(fb, index)?;
        validate_plan(&self.program, &plan, &format!("execution_plan[{index}]"))?;
        // Another thread may have loaded it meanwhile: both are the same plan.
        Ok(slot.plan.get_or_init(|| plan))
    }

    /// The execution plan (method) called `name`, or `None` when there is none or it
    /// fails validation ([`ProgramFile::load_plan`] says why).
    pub fn plan(&self, name: &str) -> Option<&ExecutionPlan> {
        self.load_plan(name).ok()
    }

    /// Every method in file order with its name and its plan, loaded now, or why it
    /// cannot be.
    pub fn plans(&self) -> impl Iterator<Item = (&str, Result<&ExecutionPlan>)> {
        self.methods
            .iter()
            .enumerate()
            .map(|(i, m)| (m.header.name.as_str(), self.load_plan_at(i)))
    }

    /// Loads every method, failing with the first method's error: the eager
    /// validation of a whole program, for tools and tests that want it.
    pub fn load_all_plans(&self) -> Result<()> {
        self.plans().try_for_each(|(_, plan)| plan.map(|_| ()))
    }

    /// True when the program has a method called `name` (loadable or not).
    pub fn has_method(&self, name: &str) -> bool {
        self.methods.iter().any(|m| m.header.name == name)
    }

    /// True when some method lists delegates (read from the plans' headers, without
    /// loading them).
    pub fn has_delegates(&self) -> bool {
        self.methods.iter().any(|m| m.header.has_delegates)
    }

    /// The method names, in file order, whether or not each loads.
    pub fn method_names(&self) -> impl Iterator<Item = &str> {
        self.methods.iter().map(|m| m.header.name.as_str())
    }

    /// The bytes of constant `data_buffer_idx` from its offset to the end of its
    /// segment (or inline buffer). Use [`ProgramFile::check_constant`] for the
    /// exact range of a tensor of known size.
    pub fn constant_data(&self, data_buffer_idx: usize) -> Result<ByteRange> {
        self.program.constant_range(data_buffer_idx)
    }

    /// Exactly `nbytes` bytes of constant `data_buffer_idx`, checked to fit.
    pub fn check_constant(&self, data_buffer_idx: usize, nbytes: usize) -> Result<ByteRange> {
        self.program.constant_range_exact(data_buffer_idx, nbytes)
    }

    /// The initial state (`nbytes` bytes) of a planned tensor with
    /// `data_buffer_idx > 0`, from `mutable_data_segments[0]`.
    pub fn mutable_data(&self, data_buffer_idx: usize, nbytes: usize) -> Result<ByteRange> {
        self.program.mutable_range(data_buffer_idx, nbytes)
    }

    /// Segment `index`, as an absolute file range.
    pub fn segment(&self, index: usize) -> Result<ByteRange> {
        self.program.segment(index)
    }

    /// A delegate's payload (inline data or a segment).
    pub fn delegate_data(&self, reference: &DelegateDataReference) -> Result<ByteRange> {
        self.program.delegate_data(reference)
    }

    /// The segment the program's `named_data` entry `key` refers to.
    pub fn named_data(&self, key: &str) -> Option<ByteRange> {
        self.program.named_data_range(key)
    }
}
