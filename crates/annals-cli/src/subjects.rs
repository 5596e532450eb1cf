//! Data subjects: `annals master-key new` and `annals erase TAG`.

use std::path::PathBuf;

use crate::failure::Failure;
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
        // The store's subject tag prefixes, and the master key file it opens with now.
        #[command(flatten)]
        subjects: SubjectArgs,
        /// The new master key file (`annals master-key new`).
        #[arg(long, value_name = "FILE")]
        new_master_key_file: PathBuf,
    },
}

pub fn master_key(command: MasterKeyCommand) -> Result<(), Failure> {
    match command {
        MasterKeyCommand::New => {
            let key = annals::MasterKey::generate()?;
            println!("{}", key.to_hex());
            Ok(())
        }
        MasterKeyCommand::Rotate {
            store,
            subjects,
            new_master_key_file,
        } => {
            let subjects = subjects
                .options()?
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
    #[command(flatten)]
    subjects: SubjectArgs,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
    /// Count the events the erasure would make unreadable, and erase nothing.
    #[arg(long, conflicts_with = "force")]
    dry_run: bool,
    /// Erase the subject even when no event carries its tag (a mistyped tag, say). Erasure
    /// is permanent: every later append naming the subject is refused.
    #[arg(long)]
    force: bool,
}

/// What a store holds of one data subject: the events carrying its tag (its erasure
/// receipts aside), and whether a receipt says it was erased already.
#[derive(Default)]
struct Holding {
    events: u64,
    erased: bool,
}

impl Holding {
    fn count(&mut self, event_type: &str) {
        if event_type == annals::SUBJECT_ERASED_TYPE {
            self.erased = true;
        } else {
            self.events += 1;
        }
    }

    /// Refuses to erase a subject no event carries, unless forced: the erasure would make
    /// nothing unreadable, yet refuse the subject for ever.
    fn check(&self, tag: &str, force: bool) -> Result<(), String> {
        if self.events == 0 && !self.erased && !force {
            return Err(format!(
                "no event carries {tag}: erasing it would make 0 events unreadable, yet it is \
                 permanent (every later append naming {tag} is refused); check the tag, or \
                 give --force to erase it anyway"
            ));
        }
        Ok(())
    }
}

/// The query of every event carrying `tag`.
fn tagged(tag: &str) -> annals::Query {
    annals::Query::item(annals::QueryItem::tags([tag]))
}

fn events(n: u64) -> String {
    if n == 1 {
        "1 event".to_string()
    } else {
        format!("{n} events")
    }
}

/// The data subjects of a store a command opens itself (a closed store): the same flags and
/// variables as `annals serve` takes, shared by every command that opens a store, so that
/// the flag an error asks for is one the command takes.
#[derive(clap::Args, Clone, Default)]
pub struct SubjectArgs {
    /// For a store with data subjects: their tag prefixes, comma separated (customer:,employee:),
    /// as the store was served with. Env: ANNALS_SUBJECT_TAGS
    #[arg(long, value_name = "PREFIXES", env = "ANNALS_SUBJECT_TAGS")]
    pub subject_tags: Option<String>,
    /// For a store with data subjects: the file holding its master key. Env:
    /// ANNALS_MASTER_KEY_FILE
    #[arg(long, value_name = "FILE", env = "ANNALS_MASTER_KEY_FILE")]
    pub master_key_file: Option<PathBuf>,
}

impl SubjectArgs {
    /// The store options' data subjects, read and checked as `annals serve` does (the master
    /// key read from its file); none when neither is given.
    pub fn options(&self) -> Result<Option<annals::SubjectOptions>, String> {
        use annals_server::config;
        let tags = self.subject_tags.as_deref().map(config::split_list);
        config::subjects(&tags.unwrap_or_default(), self.master_key_file.as_deref())
    }
}

pub fn erase(args: EraseArgs) -> Result<(), Failure> {
    let mut holding = Holding::default();
    let answer: serde_json::Value = match args.server.connect() {
        Some(remote) => {
            let mut remote = remote?;
            let query = serde_json::to_string(&tagged(&args.tag)).map_err(|e| e.to_string())?;
            let path = format!("/v1/read?query={}", crate::data::percent(&query));
            remote.stream_lines(&path, |line| {
                let event: serde_json::Value =
                    serde_json::from_slice(line).map_err(|e| format!("bad event line: {e}"))?;
                holding.count(event["type"].as_str().unwrap_or(""));
                Ok(true)
            })?;
            if args.dry_run {
                return Ok(dry_run(&args.tag, &holding, args.json)?);
            }
            holding.check(&args.tag, args.force)?;
            let body = serde_json::json!({ "tag": args.tag }).to_string();
            let bytes = remote.call("POST", "/v1/admin/erase", body.into_bytes())?;
            serde_json::from_slice(&bytes).map_err(|e| format!("the server's answer: {e}"))?
        }
        None => {
            let dir = args
                .store
                .ok_or("say which store: --store DIR (closed) or --url URL (running)")?;
            let subjects = args.subjects.options()?.ok_or(
                "erasing needs the store's subject tags and master key: --subject-tags \
                        and --master-key-file (or ANNALS_SUBJECT_TAGS, ANNALS_MASTER_KEY_FILE)",
            )?;
            let options = Options {
                durability: Durability::Synced,
                subjects: Some(subjects),
                ..Options::default()
            };
            let store = crate::data::open_store(&dir, options)?;
            // The store is closed whatever the outcome, before it is reported.
            let erased = (|| {
                let read = store
                    .read(&tagged(&args.tag), annals::ReadOptions::forwards())
                    .map_err(|e| e.to_string())?;
                for event in read {
                    holding.count(event.map_err(|e| e.to_string())?.event_type());
                }
                if args.dry_run {
                    return Ok(None);
                }
                holding.check(&args.tag, args.force)?;
                store
                    .erase_subject(&args.tag)
                    .map(Some)
                    .map_err(|e| e.to_string())
            })();
            store.close().map_err(|e| e.to_string())?;
            match erased? {
                None => return Ok(dry_run(&args.tag, &holding, args.json)?),
                Some(e) => serde_json::to_value(annals_server::answers::Erased::from(&e))
                    .map_err(|e| e.to_string())?,
            }
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
            "erased {}: {} unreadable, receipt at position {}",
            args.tag,
            events(answer["events"].as_u64().unwrap_or(0)),
            answer["receipt"]
        );
    }
    Ok(())
}

/// `erase --dry-run`: what an erasure would do, nothing erased.
fn dry_run(tag: &str, holding: &Holding, json: bool) -> Result<(), String> {
    if json {
        let answer = serde_json::json!({
            "tag": tag,
            "events": holding.events,
            "already": holding.erased,
            "dryRun": true,
        });
        println!("{answer}");
    } else if holding.erased {
        println!("{tag} was already erased; erasing it again changes nothing (dry run)");
    } else {
        println!(
            "erasing {tag} would make {} unreadable; nothing was erased (dry run){}",
            events(holding.events),
            if holding.events == 0 {
                "; erasing a subject no event carries needs --force"
            } else {
                ""
            }
        );
    }
    Ok(())
}
