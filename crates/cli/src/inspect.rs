//! `etch inspect`.

use std::path::PathBuf;

use etch_format::ProgramFile;
use etch_format::inspect::{DelegateNodeCount, ProgramSummary};
use etch_runtime::Program;

/// Arguments of `etch inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// The .pte file.
    file: PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn main(args: InspectArgs) -> anyhow::Result<()> {
    let file = crate::load::naming_file(ProgramFile::map(&args.file, false), &args.file, &[])?;
    let mut summary = ProgramSummary::new(&file);
    describe_delegates(&args.file, &mut summary);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.render_text());
    }
    Ok(())
}

/// Initialises each method's delegates with etch's backends to count their nodes and
/// packed bytes; a delegate that cannot be initialised gets the reason instead.
fn describe_delegates(path: &std::path::Path, summary: &mut ProgramSummary) {
    if summary.methods.iter().all(|m| m.delegates.is_empty()) {
        return;
    }
    let program = match Program::from_path(path).threads(1).build_program() {
        Ok(p) => p,
        Err(e) => {
            for d in summary.methods.iter_mut().flat_map(|m| &mut m.delegates) {
                d.error = Some(e.to_string());
            }
            return;
        }
    };
    for method in &mut summary.methods {
        if method.delegates.is_empty() {
            continue;
        }
        match program.plan(&method.name) {
            Ok(plan) => {
                for (d, loaded) in method.delegates.iter_mut().zip(plan.delegates()) {
                    let s = loaded.summary();
                    d.packed_bytes = Some(s.packed_bytes);
                    d.nodes = s
                        .nodes
                        .into_iter()
                        .map(|(kind, count)| DelegateNodeCount { kind, count })
                        .collect();
                }
            }
            Err(e) => {
                for d in &mut method.delegates {
                    d.error = Some(e.to_string());
                }
            }
        }
    }
}
