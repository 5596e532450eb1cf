//! The `annals` command: inspect a store and measure it.

mod bench;
mod bench_http;
mod inspect;
mod serve;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "annals", version, about = "Annals: a durable DCB event store")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (HTTP /v1 and gRPC, the UmaDB protocol) on a data directory.
    ///
    /// Defaults: data in ./annals-data, HTTP on 127.0.0.1:7400, gRPC on 127.0.0.1:50051, D3.
    /// SIGTERM (or Ctrl-C) finishes in-flight appends, syncs, checkpoints and exits 0.
    ///
    /// Example: annals serve --data-dir ./data --http 127.0.0.1:7400
    Serve(serve::ServeArgs),
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
        Command::Serve(args) => serve::run(args),
        Command::Verify(args) => inspect::verify(args),
        Command::Stats(args) => inspect::stats(args),
        Command::Bench(command) => bench::run(command),
    };
    if let Err(message) = result {
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}
