//! `etch inspect`.

use std::path::PathBuf;

use etch_format::ProgramFile;
use etch_format::inspect::ProgramSummary;

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
    let summary = ProgramSummary::new(&file);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.render_text());
    }
    Ok(())
}
