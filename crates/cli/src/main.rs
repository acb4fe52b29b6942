//! `etch`: inspect and run ExecuTorch `.pte` programs on the CPU.

mod bench;
mod chat;
mod generate;
mod image_input;
mod inspect;
mod llm_args;
mod load;
mod progress;
mod run;
mod serve;
mod verify;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use etch_memory::counting::CountingAllocator;

// Counts heap allocations for `--stats` (a few relaxed atomic adds per allocation).
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// etch runs ExecuTorch programs (.pte files) on the CPU, in pure Rust.
#[derive(Parser)]
#[command(name = "etch", version, about, long_about = None)]
#[command(after_help = "Examples:\n  \
    etch inspect model.pte\n  \
    etch run model.pte --input x.npy --output-dir out/\n  \
    etch verify model.bpte\n  \
    etch run llm.pte --input tokens.npy --input pos.npy --then --input next.npy --input pos1.npy\n  \
    etch run resnet.pte --input cat.jpg --resize 224 --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 --top-k 5 --labels imagenet_classes.txt\n  \
    etch generate --model llm.pte --tokenizer tokenizer.json --chat --prompt \"Hello\"\n  \
    etch chat --model llm.pte --tokenizer tokenizer.json\n  \
    etch bench --model llm.pte -p 128 -n 64 -r 5 -t 1,2\n  \
    etch serve --model llm.pte --tokenizer tokenizer.json --port 8000")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a program's methods, inputs and outputs, operators, memory plan and segments.
    Inspect(inspect::InspectArgs),
    /// Run a method on inputs from .npy files, images or scalars and write its outputs as
    /// .npy (--top-k lists a classifier's best classes).
    Run(run::RunArgs),
    /// Generate text with an exported LLM (KV cache), streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Chat with an exported instruct LLM, turn after turn on one KV cache (stdin lines
    /// from a pipe work too).
    Chat(chat::ChatArgs),
    /// Measure prefill and decode speed (tokens per second) of an exported LLM, per
    /// thread count, as a markdown table or JSON.
    Bench(bench::BenchArgs),
    /// Serve an exported LLM over HTTP, OpenAI-compatible (chat and completions, SSE
    /// streaming, named sessions that keep their KV cache between requests).
    Serve(serve::ServeArgs),
    /// Run every test case of a bundled program (.bpte) and check its outputs against
    /// the expected ones (official tolerances: rtol 1e-5, atol 1e-8); exit status 1 if
    /// any fails.
    Verify(verify::VerifyArgs),
}

fn main() {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Inspect(args) => inspect::main(args),
        Command::Generate(args) => generate::main(args),
        Command::Bench(args) => bench::main(args),
        Command::Chat(args) => chat::main(args),
        Command::Serve(args) => serve::main(args),
        Command::Verify(args) => verify::main(args),
        Command::Run(args) => {
            let sub = matches.subcommand_matches("run");
            run::main(args, sub)
        }
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
