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
        eprintln!("error: {}", report(&e));
        std::process::exit(1);
    }
}

/// The error and its causes joined by `: `, leaving out a cause whose text the message
/// already ends with (library errors that print their source in their own message and
/// also expose it as the source would otherwise say it twice).
fn report(e: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if message.ends_with(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::report;

    #[derive(Debug, thiserror::Error)]
    #[error("bytes 0..4 are borrowed")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    #[error("instruction 3: {source}")]
    struct Outer {
        #[source]
        source: Inner,
    }

    #[test]
    fn a_cause_the_message_already_ends_with_is_said_once() {
        let e = anyhow::Error::new(Outer { source: Inner }).context("call 0");
        assert_eq!(report(&e), "call 0: instruction 3: bytes 0..4 are borrowed");
        let plain = anyhow::anyhow!("no such file").context("model.pte");
        assert_eq!(report(&plain), "model.pte: no such file");
    }
}
