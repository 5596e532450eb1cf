//! The `annals` command: run the server, and read, write and inspect a store.

mod backup;
mod copy;
mod data;
mod failure;
mod health;
mod inspect;
mod readmodel;
mod remote;
mod schema;
mod serve;
mod subjects;

use clap::{Parser, Subcommand};

use failure::Failure;

#[global_allocator]
static ALLOCATOR: annals_server::alloc::Split = annals_server::alloc::Split;

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
    /// The server's configuration: `annals config show` prints what `annals serve` would
    /// run with.
    #[command(subcommand)]
    Config(serve::ConfigCommand),
    /// Append events: one from the arguments, or NDJSON lines from standard input.
    ///
    /// Examples:
    ///   annals append --url http://127.0.0.1:7400 --type UserRegistered --tag user:ada --data '{"name":"Ada"}'
    ///   annals append --store ./data --type Claimed --tag user:ada \
    ///       --condition '{"failIfEventsMatch":{"items":[{"tags":["user:ada"]}]}}'
    ///   cat events.ndjson | annals append --url http://127.0.0.1:7400
    ///
    /// An NDJSON line is an event as `annals export` writes it: {"type","tags","data"} and
    /// optionally "id" and "metadata". Its data may be any JSON value: a string is stored as
    /// it is, anything else (an object, an array, a number) as its compact JSON text. So
    ///   {"type":"CourseDefined","tags":["course:c1"],"data":{"capacity":10}}
    /// stores the data {"capacity":10}, and "data":"{\"capacity\":10}" stores the same bytes.
    #[command(verbatim_doc_comment)]
    Append(data::AppendArgs),
    /// Read the events matching a query, as a table or NDJSON.
    ///
    /// Examples:
    ///   annals read --url http://127.0.0.1:7400 --tag course:c1
    ///   annals read --store ./data --type OrderPlaced --backwards --limit 10 --format ndjson
    ///
    /// The table shows data as it was written: JSON as compact JSON, other text as it is,
    /// with backslashes, control characters and bytes that are not UTF-8 escaped (\\, \n,
    /// \u{1b}, \xff), cut to the terminal's width. --format ndjson shows the stored data
    /// exactly.
    #[command(verbatim_doc_comment)]
    Read(data::ReadArgs),
    /// Follow the events matching a query as they are appended (Ctrl-C to stop).
    ///
    /// Example: annals tail --url http://127.0.0.1:7400 --tag account:42
    Tail(data::TailArgs),
    /// Write events as NDJSON (to a file or standard output), with progress and a summary.
    ///
    /// Example: annals export --url http://127.0.0.1:7400 -o backup.ndjson
    Export(data::ExportArgs),
    /// Append the events of an NDJSON file (as export writes it), in atomic batches.
    ///
    /// Data may be any JSON value, as for `annals append`: a string is stored as it is (what
    /// export writes imports byte for byte), anything else as its compact JSON text.
    /// Events keep their positions (run again, an interrupted import resumes); erased
    /// events stay erased in a store with data subjects; appendedAt becomes the import's time.
    ///
    /// Example: annals import --store ./restored backup.ndjson
    #[command(verbatim_doc_comment)]
    Import(data::ImportArgs),
    /// Copy a store, positions and append times kept: from a directory to PostgreSQL or back
    /// (or between two of either), then compare both logs. A stopped copy resumes when run
    /// again.
    ///
    /// Examples:
    ///   annals copy --from ./data --to postgres://annals:secret@db1/annals
    ///   annals copy --from postgres://annals:secret@db1/annals --to ./restored
    #[command(verbatim_doc_comment)]
    Copy(copy::CopyArgs),
    /// Check every record of a closed store and compare its index checkpoint with the log, or
    /// have a running server check its live log (with --url).
    ///
    /// Examples:
    ///   annals verify --store ./data        (or: annals verify ./data)
    ///   annals verify --store postgres://annals:secret@db1/annals
    ///   annals verify --url http://127.0.0.1:7400 --api-key $ADMIN_KEY
    #[command(verbatim_doc_comment)]
    Verify(inspect::VerifyArgs),
    /// Print a closed store's head, segments and index size, or a running server's head,
    /// durability class and counters (with --url). A closed store has no class of its own:
    /// the class is a setting of the server that serves it.
    ///
    /// Examples:
    ///   annals stats --store ./data --json  (or: annals stats ./data --json)
    ///   annals stats --url http://127.0.0.1:7400 --api-key $ADMIN_KEY
    #[command(verbatim_doc_comment)]
    Stats(inspect::StatsArgs),
    /// Read models: status and lag, counts, rebuilds.
    #[command(subcommand)]
    Readmodel(readmodel::ReadModelCommand),
    /// Rebuild a store from its backup in object storage (`serve --backup`): every append
    /// shipped, or those up to a position or a time. Refuses a directory that is not empty;
    /// ends with the same check as `annals verify`.
    ///
    /// Examples:
    ///   annals restore --from s3://bucket/annals --to ./restored
    ///   annals restore --from s3://bucket/annals --to ./restored --time 2026-11-27T08:00:00Z
    #[command(verbatim_doc_comment)]
    Restore(backup::RestoreArgs),
    /// Backups in object storage.
    #[command(subcommand)]
    Backup(backup::BackupCommand),
    /// Erase a data subject: its key is deleted, so that every event carrying its tag reads
    /// back without data, everywhere the store keeps it; a receipt (annals.SubjectErased)
    /// is appended. Against a running server (admin key) or a closed store. Erasure is
    /// permanent: a tag no event carries is refused unless --force; --dry-run only counts.
    ///
    /// Examples:
    ///   annals erase customer:42 --dry-run --url http://127.0.0.1:7400 --api-key $ADMIN_KEY
    ///   annals erase customer:42 --url http://127.0.0.1:7400 --api-key $ADMIN_KEY
    ///   annals erase customer:42 --store ./data --subject-tags customer: --master-key-file master.key
    #[command(verbatim_doc_comment)]
    Erase(subjects::EraseArgs),
    /// The master key that encrypts the data subjects' keys.
    #[command(subcommand)]
    MasterKey(subjects::MasterKeyCommand),
    /// Event schemas: a JSON Schema per event type, versioned in the log, checked on append
    /// and against the stored events before a version is registered.
    #[command(subcommand)]
    Schema(schema::SchemaCommand),
    /// Ask a running server whether it serves: exit 0 and print its /health answer, or exit
    /// non-zero saying why not. For a container's health check or a script; the server is the
    /// one ANNALS_CONFIG and the ANNALS_* variables configure, unless --url names another.
    ///
    /// Example: annals health --ready
    Health(health::HealthArgs),
}

fn main() {
    annals_server::alloc::tune();
    let cli = Cli::parse();
    let result: Result<(), Failure> = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Config(command) => serve::config(command),
        Command::Append(args) => data::append(args),
        Command::Read(args) => data::read(args),
        Command::Tail(args) => data::tail(args),
        Command::Export(args) => data::export(args),
        Command::Import(args) => data::import(args),
        Command::Copy(args) => copy::run(args),
        Command::Verify(args) => inspect::verify(args),
        Command::Stats(args) => inspect::stats(args),
        Command::Readmodel(command) => readmodel::run(command).map_err(Failure::from),
        Command::Restore(args) => backup::run_restore(args),
        Command::Backup(command) => backup::run(command).map_err(Failure::from),
        Command::Erase(args) => subjects::erase(args),
        Command::MasterKey(command) => subjects::master_key(command),
        Command::Schema(command) => schema::run(command),
        Command::Health(args) => health::run(args),
    };
    if let Err(failure) = result {
        eprintln!("error: {failure}");
        std::process::exit(failure.status());
    }
}
