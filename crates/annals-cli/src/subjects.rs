//! Data subjects: `annals master-key new` and `annals erase TAG`.

use std::path::PathBuf;

use annals::{Durability, Options};

/// The master key that encrypts the data subjects' keys.
#[derive(clap::Subcommand)]
pub enum MasterKeyCommand {
    /// Print a fresh random master key (64 hexadecimal characters, 256 bits), for a master
    /// key file (`annals serve --master-key-file FILE`). Keep it apart from the data: without
    /// it, a store's personal data cannot be read.
    ///
    /// Example: annals master-key new > /etc/annals/master.key && chmod 600 /etc/annals/master.key
    New,
    /// Wrap a store's subject keys under a new master key: only the key file (or, on
    /// PostgreSQL, the keys' table, in one transaction) is written anew. Afterwards the store
    /// opens with the new key only; on PostgreSQL, servers still running make no new key
    /// until they are started with it.
    ///
    /// Example: annals master-key rotate --store ./data --subject-tags customer: \
    ///     --master-key-file old.key --new-master-key-file new.key
    Rotate {
        /// The closed store's data directory, or a PostgreSQL URL.
        #[arg(long, visible_alias = "dir", value_name = "DIR")]
        store: String,
        /// The store's subject tag prefixes, comma separated. Env: ANNALS_SUBJECT_TAGS
        #[arg(long, value_name = "PREFIXES")]
        subject_tags: Option<String>,
        /// The master key file the store opens with now. Env: ANNALS_MASTER_KEY_FILE
        #[arg(long, value_name = "FILE")]
        master_key_file: Option<PathBuf>,
        /// The new master key file (`annals master-key new`).
        #[arg(long, value_name = "FILE")]
        new_master_key_file: PathBuf,
    },
}

pub fn master_key(command: MasterKeyCommand) -> Result<(), String> {
    match command {
        MasterKeyCommand::New => {
            let key = annals::MasterKey::generate()?;
            println!("{}", key.to_hex());
            Ok(())
        }
        MasterKeyCommand::Rotate {
            store,
            subject_tags,
            master_key_file,
            new_master_key_file,
        } => {
            let subjects = subjects(subject_tags.as_deref(), master_key_file)?
                .ok_or("rotating needs the store's subject tags and its master key file")?;
            let text = std::fs::read_to_string(&new_master_key_file)
                .map_err(|e| format!("cannot read {}: {e}", new_master_key_file.display()))?;
            let new = annals::MasterKey::from_hex(&text)
                .map_err(|e| format!("{}: {e}", new_master_key_file.display()))?;
            let options = Options {
                subjects: Some(subjects),
                ..Options::default()
            };
            let store = crate::data::open_store(&store, options)?;
            let keys = store.rotate_master_key(&new).map_err(|e| e.to_string())?;
            store.close().map_err(|e| e.to_string())?;
            println!(
                "{keys} keys wrapped under the new master key; start the store with {} from now on",
                new_master_key_file.display()
            );
            Ok(())
        }
    }
}

#[derive(clap::Args)]
pub struct EraseArgs {
    /// The data subject's tag, e.g. customer:42.
    #[arg(value_name = "TAG")]
    tag: String,
    /// A closed store's data directory (or give --url for a running server).
    #[arg(
        long,
        visible_alias = "dir",
        value_name = "DIR",
        conflicts_with = "url"
    )]
    store: Option<String>,
    #[command(flatten)]
    server: crate::remote::RemoteArgs,
    /// With --store: the tag prefixes of data subjects, comma separated. Env:
    /// ANNALS_SUBJECT_TAGS
    #[arg(long, value_name = "PREFIXES")]
    subject_tags: Option<String>,
    /// With --store: the store's master key file. Env: ANNALS_MASTER_KEY_FILE
    #[arg(long, value_name = "FILE")]
    master_key_file: Option<PathBuf>,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

/// The data subjects set by `ANNALS_SUBJECT_TAGS` and `ANNALS_MASTER_KEY_FILE` (and the
/// given flags over them), as `annals serve` reads them.
pub fn subjects(
    tags: Option<&str>,
    key_file: Option<PathBuf>,
) -> Result<Option<annals::SubjectOptions>, String> {
    let mut config = annals_server::Config::default();
    config.apply_env(
        std::env::vars()
            .filter(|(k, _)| k == "ANNALS_SUBJECT_TAGS" || k == "ANNALS_MASTER_KEY_FILE"),
    )?;
    if let Some(tags) = tags {
        config.subject_tags = annals_server::config::split_list(tags);
    }
    if let Some(file) = key_file {
        config.master_key_file = Some(file);
    }
    config.subjects()
}

pub fn erase(args: EraseArgs) -> Result<(), String> {
    let answer: serde_json::Value = match args.server.connect() {
        Some(remote) => {
            let body = serde_json::json!({ "tag": args.tag }).to_string();
            let bytes = remote?.call("POST", "/v1/admin/erase", body.into_bytes())?;
            serde_json::from_slice(&bytes).map_err(|e| format!("the server's answer: {e}"))?
        }
        None => {
            let dir = args
                .store
                .ok_or("say which store: --store DIR (closed) or --url URL (running)")?;
            let subjects = subjects(args.subject_tags.as_deref(), args.master_key_file)?.ok_or(
                "erasing needs the store's subject tags and master key: --subject-tags \
                        and --master-key-file (or ANNALS_SUBJECT_TAGS, ANNALS_MASTER_KEY_FILE)",
            )?;
            let options = Options {
                durability: Durability::Synced,
                subjects: Some(subjects),
                ..Options::default()
            };
            let store = crate::data::open_store(&dir, options)?;
            let e = store.erase_subject(&args.tag).map_err(|e| e.to_string())?;
            store.close().map_err(|e| e.to_string())?;
            annals_server::subjects::erasure_json(&e)
        }
    };
    if args.json {
        println!("{answer}");
    } else if answer["already"] == true {
        println!(
            "{} was already erased (receipt at position {})",
            args.tag, answer["receipt"]
        );
    } else {
        println!(
            "erased {}: {} events unreadable, receipt at position {}",
            args.tag, answer["events"], answer["receipt"]
        );
    }
    Ok(())
}
