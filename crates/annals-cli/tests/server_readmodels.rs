//! Read models on `annals serve`: declared in the configuration file, read over HTTP, in
//! /metrics, driven by `annals readmodel`, surviving kill -9 and SIGTERM.
mod common;

use std::path::Path;
use std::process::Command;

use common::{append_body, request, ServerProcess};

fn config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("annals.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[[read_models]]
name = "seats-by-course"
types = ["StudentEnrolled"]
group_by = "course:"

[[read_models]]
name = "everything"
{extra}
"#
        ),
    )
    .unwrap();
    path
}

fn start(dir: &Path, config: &Path) -> ServerProcess {
    ServerProcess::start(&dir.join("data"), &["--config", config.to_str().unwrap()])
}

fn enrol(server: &ServerProcess, course: u32, student: u32) -> u64 {
    let answer = server.append(&append_body(
        &[(
            "StudentEnrolled",
            &[&format!("course:c{course}"), &format!("student:s{student}")],
            "",
        )],
        None,
    ));
    answer["position"].as_u64().unwrap()
}

fn cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_annals"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn model(server: &ServerProcess, query: &str) -> (u16, serde_json::Value) {
    let r = server.get(&format!("/v1/readmodels/seats-by-course{query}"));
    (r.status, r.json())
}

/// Goal: a declared read model counts what it should, lets a client wait for its own write,
/// shows position and lag in its status and in /metrics, rebuilds on request, refuses bad
/// requests clearly, and resumes from its checkpoint after kill -9 and after SIGTERM.
#[test]
fn read_models_on_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let mut server = start(dir.path(), &config);
    let url = format!("http://{}", server.http);
    let mut last = 0;
    for i in 0..60 {
        last = enrol(&server, i % 4, i);
        server.append(&append_body(&[("Other", &["course:c1"], "")], None));
    }
    // Read your own write: wait until the model has folded `last`.
    let (status, view) = model(&server, &format!("?key=c1&minPosition={last}&waitMs=5000"));
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["count"], 15);
    assert_eq!(view["total"], 60);
    assert_eq!(view["keyCount"], 4);
    assert_eq!(view["groupBy"], "course:");
    assert!(view["position"].as_u64().unwrap() >= last);
    assert_eq!(view["rebuiltBecause"], "no checkpoint");

    // A position that will not come: 504 with the model as it stands.
    let (status, view) = model(&server, "?minPosition=100000&waitMs=50");
    assert_eq!(status, 504);
    assert_eq!(view["total"], 60);
    // Bad requests.
    let (status, view) = model(&server, "?bogus=1");
    assert_eq!(status, 400);
    assert_eq!(view["kind"], "invalid_parameter");
    let r = server.get("/v1/readmodels/nope");
    assert_eq!((r.status, r.kind()), (404, "unknown_read_model".to_owned()));
    let r = request(
        server.http,
        "POST",
        "/v1/admin/readmodels/nope/rebuild",
        &[],
        b"",
    );
    assert_eq!(r.status, 404);

    // Status lists both, caught up.
    let head = server.head();
    let list = server.get("/v1/readmodels").json();
    let models = list["readModels"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    let everything = models.iter().find(|m| m["name"] == "everything").unwrap();
    assert_eq!(everything["total"], head);
    assert_eq!(everything["kind"], "state");
    // /metrics.
    let text = server.get("/metrics").text();
    for needed in [
        format!("annals_readmodel_position{{name=\"everything\"}} {head}"),
        "annals_readmodel_lag{name=\"everything\"} 0".to_owned(),
        "annals_readmodel_failing{name=\"seats-by-course\"} 0".to_owned(),
        "annals_readmodel_rebuilds_total{name=\"seats-by-course\"} 0".to_owned(),
    ] {
        assert!(text.contains(&needed), "missing {needed:?} in\n{text}");
    }
    // The command line.
    let (ok, out, err) = cli(&["readmodel", "status", "--url", &url]);
    assert!(ok, "{err}");
    assert!(
        out.contains("seats-by-course") && out.contains("running"),
        "{out}"
    );
    let (ok, out, err) = cli(&[
        "readmodel",
        "get",
        "seats-by-course",
        "--key",
        "c2",
        "--min-position",
        &last.to_string(),
        "--url",
        &url,
    ]);
    assert!(ok, "{err}");
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(got["count"], 15);
    let (ok, out, err) = cli(&["readmodel", "rebuild", "seats-by-course", "--url", &url]);
    assert!(ok, "{err}");
    assert!(out.contains("rebuilding"), "{out}");
    let view = annals_testkit::eventually(
        "the rebuild to catch up",
        std::time::Duration::from_secs(20),
        || {
            let (_, view) = model(&server, "?key=c1");
            if view["rebuilds"] == 1 && view["lag"] == 0 && view["total"] == 60 {
                Ok(view)
            } else {
                Err(view)
            }
        },
    );
    assert_eq!(view["count"], 15);
    assert_eq!(view["rebuiltBecause"], "a rebuild was asked for");
    let (ok, _, err) = cli(&["readmodel", "get", "nope", "--url", &url]);
    assert!(!ok && err.contains("no read model named"), "{err}");

    // kill -9: the restart resumes from a checkpoint (taken at most a second apart) and ends
    // with the same counts.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    for i in 0..10 {
        last = enrol(&server, 1, 100 + i);
    }
    server.kill9();
    let mut server = start(dir.path(), &config);
    let (status, view) = model(&server, &format!("?key=c1&minPosition={last}&waitMs=5000"));
    assert_eq!(status, 200);
    assert_eq!(view["count"], 25);
    assert_eq!(view["total"], 70);
    assert!(view["resumedFrom"].as_u64().unwrap() > 0, "{view}");
    assert_eq!(view["rebuiltBecause"], serde_json::Value::Null);

    // SIGTERM writes a last checkpoint at the position reached.
    let head = server.head();
    let (_, view) = model(&server, &format!("?minPosition={head}&waitMs=5000"));
    assert_eq!(view["position"], head);
    assert!(server.terminate().success());
    let (ok, out, err) = cli(&[
        "readmodel",
        "status",
        "--dir",
        dir.path().join("data").to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("seats-by-course") && out.contains("everything"),
        "{out}"
    );
    let saved: serde_json::Value = serde_json::from_str(
        &cli(&[
            "readmodel",
            "status",
            "--json",
            "--dir",
            dir.path().join("data").to_str().unwrap(),
        ])
        .1,
    )
    .unwrap();
    for s in saved.as_array().unwrap() {
        assert_eq!(s["position"], head, "{s}");
    }
    // Offline rebuild: the checkpoint goes; the next start folds from the first event.
    let (ok, out, _) = cli(&[
        "readmodel",
        "rebuild",
        "seats-by-course",
        "--dir",
        dir.path().join("data").to_str().unwrap(),
    ]);
    assert!(ok && out.contains("removed the checkpoint"), "{out}");
    let mut server = start(dir.path(), &config);
    let (_, view) = model(&server, &format!("?key=c1&minPosition={head}&waitMs=5000"));
    assert_eq!(view["rebuiltBecause"], "no checkpoint");
    assert_eq!(view["count"], 25);
    let everything = server.get("/v1/readmodels/everything").json();
    assert_eq!(everything["resumedFrom"], head);
    server.terminate();
}

/// Goal: a bad declaration stops the server at start with a clear message; read-model
/// endpoints follow the key scopes (read for status, admin for rebuild).
#[test]
fn declarations_and_scopes() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, message) in [
        ("[[read_models]]\nname = \"ok\"", "declared twice"),
        ("[[read_models]]\nname = \"a/b\"", "invalid read-model name"),
        ("group_by = \"\"", "group_by must not be empty"),
        ("colour = \"red\"", "unknown field"),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, format!("[[read_models]]\nname = \"ok\"\n{extra}\n")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_annals"))
            .args(["serve", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--http", "127.0.0.1:0", "--grpc", "off", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(message), "{extra}: {err}");
    }

    let config = config(
        dir.path(),
        "[[api_keys]]\nkey = \"reader-key-0000000001\"\nscopes = [\"read\"]\n\
         [[api_keys]]\nkey = \"admin-key-00000000003\"\nscopes = [\"admin\"]",
    );
    // The keys must come before the tables that follow them in TOML; write them first.
    let text = std::fs::read_to_string(&config).unwrap();
    let (models, keys) = text.split_at(text.find("[[api_keys]]").unwrap());
    std::fs::write(&config, format!("{keys}\n{models}")).unwrap();
    let mut server = start(dir.path(), &config);
    let auth = |key: &str| format!("Bearer {key}");
    for (method, path, good, lacking, ok) in [
        ("GET", "/v1/readmodels", "reader-key-0000000001", "", 200),
        (
            "GET",
            "/v1/readmodels/everything",
            "reader-key-0000000001",
            "",
            200,
        ),
        (
            "POST",
            "/v1/admin/readmodels/everything/rebuild",
            "admin-key-00000000003",
            "reader-key-0000000001",
            202,
        ),
    ] {
        let r = request(server.http, method, path, &[], b"");
        assert_eq!(r.status, 401, "{path}");
        if !lacking.is_empty() {
            let header = auth(lacking);
            let r = request(
                server.http,
                method,
                path,
                &[("authorization", &header)],
                b"",
            );
            assert_eq!(r.status, 403, "{path}");
        }
        let header = auth(good);
        let r = request(
            server.http,
            method,
            path,
            &[("authorization", &header)],
            b"",
        );
        assert_eq!(r.status, ok, "{path}: {}", r.text());
    }
    server.terminate();
}
