//! The `annals` command: inspect a store and measure it.

mod bench;
mod inspect;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "annals", version, about = "Annals: a durable DCB event store")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check every record of a closed store and compare its index checkpoint with the log.
    ///
    /// Example: annals verify ./data
    Verify(inspect::VerifyArgs),
    /// Print a store's head, segments, index size and durability class.
    ///
    /// Example: annals stats ./data --json
    Stats(inspect::StatsArgs),
    /// Benchmarks; each prints one JSON object as its last line.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Verify(args) => inspect::verify(args),
        Command::Stats(args) => inspect::stats(args),
        Command::Bench(command) => bench::run(command),
    };
    if let Err(message) = result {
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}
