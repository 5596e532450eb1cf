//! The store against the reference model over random operation sequences.
mod common;

use std::path::Path;
use std::sync::Arc;

use annals::sim::SimIo;
use annals::{AppendCondition, NewEvent, Query, QueryItem, Store};
use common::harness::{small_options, DIR};
use common::{check_against_model, Model};
use proptest::prelude::*;

/// A condition as generated: items of (type kinds, tag kinds), and `after`.
type ConditionSpec = (Vec<(Vec<u8>, Vec<u8>)>, Option<u64>);

#[derive(Debug, Clone)]
enum Op {
    Append {
        events: Vec<(u8, Vec<u8>)>,
        condition: Option<ConditionSpec>,
    },
    Reopen,
    Check,
}

fn names(kinds: &[u8], prefix: &str) -> Vec<String> {
    kinds.iter().map(|k| format!("{prefix}{k}")).collect()
}

fn op() -> impl Strategy<Value = Op> {
    let item = (
        proptest::collection::vec(0u8..3, 0..2),
        proptest::collection::vec(0u8..5, 0..3),
    );
    prop_oneof![
        8 => (
            proptest::collection::vec((0u8..3, proptest::collection::vec(0u8..5, 0..3)), 1..4),
            proptest::option::of((proptest::collection::vec(item, 0..3), proptest::option::of(0u64..40))),
        )
            .prop_map(|(events, condition)| Op::Append { events, condition }),
        1 => Just(Op::Reopen),
        1 => Just(Op::Check),
    ]
}

fn to_events(spec: &[(u8, Vec<u8>)], serial: usize) -> Vec<NewEvent> {
    spec.iter()
        .enumerate()
        .map(|(i, (t, tags))| {
            let mut tags = names(tags, "tag");
            tags.sort();
            tags.dedup();
            NewEvent::new(format!("Type{t}"), format!("{serial}-{i}").into_bytes()).tags(tags)
        })
        .collect()
}

fn to_condition(spec: &ConditionSpec) -> AppendCondition {
    let items = spec
        .0
        .iter()
        .map(|(types, tags)| QueryItem {
            types: names(types, "Type"),
            tags: names(tags, "tag"),
        })
        .collect();
    AppendCondition::new(Query { items }, spec.1)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Goal: appends (with and without conditions), reads of every shape and reopens agree with
    /// the brute-force model. Method: random sequences on the simulated disk with small segments.
    #[test]
    fn store_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
        let io = SimIo::new(1);
        let open = || Store::open_with_io(Arc::new(io.clone()), Path::new(DIR), small_options()).unwrap();
        let mut store = open();
        let mut model = Model::default();
        for (serial, op) in ops.iter().enumerate() {
            match op {
                Op::Append { events, condition } => {
                    let events = to_events(events, serial);
                    let condition = condition.as_ref().map(to_condition);
                    let got = store.append(&events, condition.as_ref()).map_err(|e| e.conflict_position().expect("only conflicts are expected"));
                    let want = model.append(&events, condition.as_ref());
                    prop_assert_eq!(got, want);
                }
                Op::Reopen => {
                    store.close().unwrap();
                    store = open();
                }
                Op::Check => check_against_model(&store, &model).map_err(TestCaseError::fail)?,
            }
        }
        check_against_model(&store, &model).map_err(TestCaseError::fail)?;
    }
}
