//! `annals-bench`: the benchmarks and load generators of Annals, as programs. Each prints one
//! JSON object as its last line. Kept out of the `annals` binary that users run. The command
//! list is here, at the root, and `bench.rs` holds what the benchmarks share.

mod bench;
mod bench_backup;
mod bench_decide;
mod bench_http;
mod bench_image;
mod bench_postgres;
mod bench_schema;
mod bench_snapshot;
mod bench_subjects;
mod bench_traces;
mod bench_umadb;
mod exchange;
mod grpc_client;
mod h2wire;
mod http1;

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
    command: BenchCommand,
}

/// The benchmarks, one subcommand each.
#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Appends from N writers (async tasks or threads); reports throughput, latency and fsyncs
    /// per batch.
    ///
    /// Example: annals-bench append --dir /tmp/a --writers 64 --batch 1 --events 200000 --conditional
    Append(bench::AppendArgs),
    /// Full scans and selective reads (one tag among 100,000, ten events each).
    ///
    /// Example: annals-bench read --dir /tmp/r --events 1000000
    Read(bench::ReadArgs),
    /// Open time with the checkpoint and when rebuilding, and index bytes per event.
    ///
    /// Example: annals-bench recover --dir /tmp/c --events 10000000
    Recover(bench::RecoverArgs),
    /// Load over HTTP or gRPC from concurrent connections against a server (its own, started
    /// on --dir, unless --url is given): append, conditional append, read or mixed workloads.
    ///
    /// Example: annals-bench http --connections 64 --workload conditional --seconds 10
    Http(bench_http::HttpArgs),
    /// The course-subscription decision (two projections, one read, one conditional append)
    /// from N clients, embedded; decisions per second beside the fsync floor.
    ///
    /// Example: annals-bench decide --clients 64 --courses 1000 --seconds 5
    Decide(bench_decide::DecideArgs),
    /// The raw fdatasync rate of a directory (small write + fdatasync in a loop), on a
    /// preallocated and on a growing file, and per CPU with the looping thread held on each.
    ///
    /// Example: annals-bench fsync --dir /tmp/f
    Fsync(bench::FsyncArgs),
    /// The PostgreSQL backend beside the database's own commit rate in the same run: one
    /// client, 64 writers x 512 events, 64 HTTP connections on one server and on two, selective
    /// reads beside files (a throwaway cluster unless --url is given).
    ///
    /// Example: annals-bench postgres --seconds 5 --runs 3
    Postgres(bench_postgres::PostgresArgs),
    /// The matching engine on a deterministic scenario, through its journal: throughput,
    /// trades, the matcher's latency, the acknowledgement latency of durable modes, fsyncs and
    /// the state hash.
    ///
    /// Example: annals-bench exchange --scenario normal --messages 5000000 --durability d3-pipelined
    Exchange(exchange::BenchArgs),
    /// UmaDB's own Rust client against Annals and against UmaDB's server, in the same run:
    /// conditional appends from tasks sharing one channel, beside the fsync floor.
    ///
    /// Example: annals-bench umadb --writers 64 --seconds 10 --umadb-bin "$ANNALS_UMADB_BIN"
    Umadb(bench_umadb::UmadbArgs),
    /// The backup to object storage on a throwaway SeaweedFS: 64 writers with and without a
    /// backup (alternated) and the backup's lag, D4 over HTTP beside the object store's own
    /// rate of sequential puts, restoring a large store, and a replica's full scan beside
    /// the primary's.
    ///
    /// Example: annals-bench backup --runs 3 --restore-events 10000000
    Backup(bench_backup::BackupArgs),
    /// Data subjects (crypto-shredding): 64 writers and 1, each event tagged with one of
    /// 100,000 subjects, with and without subjects configured (alternated); a full scan and
    /// selective reads of sealed events beside plain ones; erasing a subject of 100,000 events
    /// beside one of a single event.
    ///
    /// Example: annals-bench subjects --runs 3
    Subjects(bench_subjects::SubjectsArgs),
    /// Decisions' snapshots: a decision over a million events with a snapshot at most 1,000
    /// events old, in the library and over HTTP, beside the same without one (decide); a
    /// million snapshot keys: disk, memory, the time to load one (keys).
    ///
    /// Example: annals-bench snapshot --workload decide --events 1000000
    Snapshot(bench_snapshot::SnapshotArgs),
    /// Event schemas: 64 HTTP connections and 64 embedded writers of 1 KiB events whose type
    /// has a ten-property schema, checked and not (alternated); the check of a new version
    /// against a million stored events.
    ///
    /// Example: annals-bench schema --runs 3
    Schema(bench_schema::SchemaArgs),
    /// The container image (scripts/image, with podman): its size uncompressed and gzipped,
    /// the time scripts/image takes on a built tree, and the time from `podman run` to the
    /// first acknowledged append.
    ///
    /// Example: annals-bench image --runs 3
    Image(bench_image::ImageArgs),
    /// Traces over OTLP: 64 HTTP connections of conditional appends against a server
    /// exporting every request's spans to a local Jaeger, and one sampling 1%, each
    /// alternated with a server exporting nothing.
    ///
    /// Example: annals-bench traces --runs 5
    Traces(bench_traces::TracesArgs),
}

/// Runs one benchmark and prints its JSON object.
fn run(command: BenchCommand) -> Result<(), String> {
    let result = match command {
        BenchCommand::Append(args) => bench::append(args)?,
        BenchCommand::Read(args) => bench::read(args)?,
        BenchCommand::Recover(args) => bench::recover(args)?,
        BenchCommand::Fsync(args) => bench::fsync(args)?,
        BenchCommand::Http(args) => bench_http::run(args)?,
        BenchCommand::Decide(args) => bench_decide::run(args)?,
        BenchCommand::Exchange(args) => exchange::run(args)?,
        BenchCommand::Umadb(args) => bench_umadb::run(args)?,
        BenchCommand::Postgres(args) => bench_postgres::run(args)?,
        BenchCommand::Backup(args) => bench_backup::run(args)?,
        BenchCommand::Subjects(args) => bench_subjects::run(args)?,
        BenchCommand::Snapshot(args) => bench_snapshot::run(args)?,
        BenchCommand::Schema(args) => bench_schema::run(args)?,
        BenchCommand::Image(args) => bench_image::run(args)?,
        BenchCommand::Traces(args) => bench_traces::run(args)?,
    };
    println!("{result}");
    Ok(())
}

fn main() {
    annals_server::alloc::tune();
    let cli = Cli::parse();
    if let Err(message) = run(cli.command) {
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}
