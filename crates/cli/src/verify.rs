//! `etch verify`: runs every test case a bundled program (`.bpte`) carries and checks
//! the outputs against its expected ones, with the official `verify_method_outputs`
//! rules and default tolerances (`etch_runtime::bundled`). Also where `etch run`
//! unwraps a `.bpte` into its program.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::bail;
use etch_format::{BundledProgramFile, is_bundled_program};
use etch_runtime::bundled::{CaseOutcome, CaseReport, Tolerance, verify_bundled};
use etch_runtime::{Module, ModuleBuilder};

/// Arguments of `etch verify`.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    etch verify model.bpte\n  \
    etch verify model.bpte --json")]
pub struct VerifyArgs {
    /// The bundled program (.bpte, made with executorch.devtools.BundledProgram).
    file: PathBuf,
    /// Relative tolerance (of |actual|). Default: the official verify_method_outputs'.
    #[arg(long, default_value_t = Tolerance::OFFICIAL.rtol)]
    rtol: f64,
    /// Absolute tolerance. Default: the official verify_method_outputs'.
    #[arg(long, default_value_t = Tolerance::OFFICIAL.atol)]
    atol: f64,
    /// Print one JSON object instead of a line per test case.
    #[arg(long)]
    json: bool,
    /// Kernel threads (0: one per available core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[arg(long, help = crate::load::NO_FOLD_HELP)]
    no_fold: bool,
}

/// A builder for the program in `path`: the wrapped program of a bundled program
/// (copied out of it), or the `.pte` itself.
pub fn module_builder(path: &Path) -> anyhow::Result<ModuleBuilder> {
    let mut head = [0u8; 8];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    if !is_bundled_program(&head[..n]) {
        return Ok(Module::from_path(path));
    }
    let bundled = crate::load::naming_file(BundledProgramFile::read(path), path, &[])?;
    let bytes = bundled.program_shared_bytes()?;
    Ok(Module::from_bytes(bytes))
}

pub fn main(args: VerifyArgs) -> anyhow::Result<()> {
    let tol = Tolerance {
        rtol: args.rtol,
        atol: args.atol,
    };
    if !(tol.rtol >= 0.0 && tol.atol >= 0.0) {
        bail!("--rtol and --atol must be >= 0");
    }
    let path = &args.file;
    let bundled = crate::load::naming_file(BundledProgramFile::read(path), path, &[])?;
    let program = Module::from_bytes(bundled.program_shared_bytes()?)
        .threads(args.threads)
        .fold_constants(!args.no_fold)
        .build_program();
    let program = crate::load::naming_file(program, path, &[])?;
    let start = Instant::now();
    let reports = verify_bundled(&program, &bundled, tol);
    let seconds = start.elapsed().as_secs_f64();
    let passed = reports.iter().filter(|r| r.passed()).count();
    let failed = reports
        .iter()
        .filter(|r| matches!(r.outcome, CaseOutcome::Failed(_)))
        .count();
    let errors = reports.len() - passed - failed;
    if args.json {
        let cases: Vec<_> = reports.iter().map(case_json).collect();
        let doc = serde_json::json!({
            "file": path.display().to_string(),
            "rtol": tol.rtol,
            "atol": tol.atol,
            "cases": cases,
            "passed": passed,
            "failed": failed,
            "errors": errors,
            "seconds": seconds,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let width = reports.iter().map(|r| r.method.len()).max().unwrap_or(0);
        for r in &reports {
            println!("{}", case_line(r, width));
        }
        println!(
            "{} test case(s) in {} method(s): {passed} passed, {failed} failed, {errors} errors \
             (rtol {:e}, atol {:e}; {:.3} s)",
            reports.len(),
            bundled.method_test_suites().len(),
            tol.rtol,
            tol.atol,
            seconds
        );
    }
    if reports.is_empty() {
        bail!("{}: the bundled program has no test cases", path.display());
    }
    if passed != reports.len() {
        bail!(
            "{} of {} test case(s) did not pass",
            reports.len() - passed,
            reports.len()
        );
    }
    Ok(())
}

fn status(r: &CaseReport) -> (&'static str, Option<&str>) {
    match &r.outcome {
        CaseOutcome::Passed => ("pass", None),
        CaseOutcome::Failed(why) => ("FAIL", Some(why)),
        CaseOutcome::Error(why) => ("ERROR", Some(why)),
    }
}

fn case_line(r: &CaseReport, width: usize) -> String {
    let (word, why) = status(r);
    let mut line = format!(
        "{:<width$}  case {:<3} {word:<5}  max abs error {:.3e}  max rel error {:.3e}",
        r.method, r.index, r.max_abs_error, r.max_rel_error
    );
    if let Some(why) = why {
        line.push_str(&format!("  ({why})"));
    }
    line
}

fn case_json(r: &CaseReport) -> serde_json::Value {
    let (word, why) = status(r);
    serde_json::json!({
        "method": r.method,
        "index": r.index,
        "status": word.to_ascii_lowercase(),
        "max_abs_error": r.max_abs_error,
        "max_rel_error": r.max_rel_error,
        "reason": why,
    })
}
