//! `annals-bench`: the benchmarks and load generators of Annals, as programs. Each prints one
//! JSON object as its last line. Kept out of the `annals` binary that users run.

mod bench;
mod bench_backup;
mod bench_decide;
mod bench_http;
mod bench_postgres;
mod bench_subjects;
mod bench_umadb;
mod exchange;
mod grpc_client;
mod h2wire;
mod http1;

use std::path::PathBuf;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: annals_server::alloc::Split = annals_server::alloc::Split;

#[derive(Parser)]
#[command(
    name = "annals-bench",
    version,
    about = "Benchmarks of Annals; each prints one JSON object as its last line"
)]
struct Cli {
    #[command(subcommand)]
    command: bench::BenchCommand,
}

/// The `annals` binary that benchmarks start as their server: `ANNALS_BIN`, else the one beside
/// this program (both are built into the same target directory).
pub(crate) fn server_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("ANNALS_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let sibling = exe.with_file_name("annals");
    if sibling.exists() {
        Ok(sibling)
    } else {
        Err(format!(
            "no annals binary beside {} (build it with cargo build -p annals-cli, or set ANNALS_BIN)",
            exe.display()
        ))
    }
}

fn main() {
    annals_server::alloc::tune();
    let cli = Cli::parse();
    if let Err(message) = bench::run(cli.command) {
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}
