//! The index's unit tests.

use super::*;

/// Goal: a thread counts as holding the index lock exactly while it holds a guard, read or
/// write (what the writer's I/O asserts against; debug builds count, release never does).
#[test]
fn held_while_a_guard_lives() {
    let lock = IndexLock::new(Index::default());
    assert!(!held_here());
    {
        let _read = lock.read();
        assert_eq!(held_here(), cfg!(debug_assertions));
        let other = std::thread::spawn(held_here).join().unwrap();
        assert!(!other, "another thread holds nothing");
    }
    assert!(!held_here());
    {
        let _write = lock.write();
        assert_eq!(held_here(), cfg!(debug_assertions));
    }
    assert!(!held_here());
}

/// Goal: the galloping search answers as a binary search does. Method: every probe from 0
/// to past the last position of lists of positions (from 1 up, with gaps) of every length
/// up to 70, against `partition_point`.
#[test]
fn first_at_least_agrees_with_partition_point() {
    for n in 0..70u64 {
        let list: Vec<u64> = (0..n).map(|i| 3 * i + i % 3 + 1).collect();
        let top = list.last().copied().unwrap_or(0) + 3;
        for x in 0..=top {
            assert_eq!(
                first_at_least(&list, x),
                list.partition_point(|&p| p < x),
                "length {n}, probe {x}"
            );
        }
    }
    assert_eq!(first_at_least(&[5, 9], u64::MAX), 2);
}

/// Goal: a query item's ids stay whole, sorted and without repeats, inline or past the
/// inline ones on the heap. Method: lists of every length up to twelve with repeats,
/// against a sorted set; tags sorted by a key keep equal ids side by side.
#[test]
fn ids_sort_and_drop_repeats_inline_and_on_the_heap() {
    for n in 0..12u32 {
        let mut ids = Ids::EMPTY;
        let given: Vec<u32> = (0..n).map(|i| (i * 7) % 5 + i / 5).collect();
        for &id in &given {
            ids.push(id);
        }
        assert_eq!(ids.as_slice(), &given[..], "length {n}");
        assert_eq!(matches!(ids, Ids::Heap(_)), n as usize > INLINE_IDS);
        ids.sort_dedup_by_key(|id| (0, id));
        let set: std::collections::BTreeSet<u32> = given.iter().copied().collect();
        assert_eq!(
            ids.as_slice(),
            set.into_iter().collect::<Vec<_>>(),
            "length {n}"
        );
        ids.sort_dedup_by_key(|id| (usize::from(id % 2 == 0), id));
        assert!(ids
            .as_slice()
            .iter()
            .skip_while(|&&id| id % 2 == 1)
            .all(|&id| id % 2 == 0));
    }
}

/// Goal: the index's fast byte comparison for names agrees with plain equality at every length and
/// wherever two names differ.
#[test]
fn same_bytes_agrees_with_slice_equality() {
    let base: Vec<u8> = (0..40u8).map(|b| b.wrapping_mul(37)).collect();
    for n in 0..base.len() {
        let a = &base[..n];
        assert!(same_bytes(a, a));
        assert!(!same_bytes(a, &base[..n + 1]));
        for at in 0..n {
            let mut b = a.to_vec();
            b[at] ^= 0x40;
            assert!(!same_bytes(a, &b), "length {n}, differing at {at}");
        }
    }
}

/// Goal: the tag-id cache grows with the tag table and never gives a wrong id across its
/// growth. Method: intern 100,000 tags (the cache grows from 64K to 256K slots), then ask
/// for every one again, in another order.
#[test]
fn the_tag_cache_grows_with_the_tags_and_keeps_every_id() {
    let mut index = Index::default();
    let name = |i: u32| format!("entity:{i}");
    for i in 0..100_000u32 {
        assert_eq!(index.tag_id(name(i).as_bytes()), i);
    }
    assert_eq!(index.tag_cache.len(), 1 << 18);
    for i in (0..100_000u32).rev() {
        assert_eq!(index.tag_id(name(i).as_bytes()), i);
    }
    assert_eq!(index.tag_names.len(), 100_000);
}

/// Goal: a name map finds every name with its id through the growth of its shards, and
/// spreads names over all of its shards (a shard chosen from bits its table also uses
/// would leave shards empty, or fill one). Method: 200,000 names, each looked up by bytes
/// and by key, against the shards' sizes.
#[test]
fn a_name_map_keeps_every_id_and_spreads_names_over_its_shards() {
    let mut map = NameMap::default();
    let name = |i: u32| format!("student:{i}");
    for i in 0..200_000u32 {
        assert_eq!(map.insert(NameKey::new(name(i).as_bytes()), i), None);
    }
    assert_eq!(map.len(), 200_000);
    for i in (0..200_000u32).rev() {
        assert_eq!(map.get(name(i).as_bytes()), Some(&i));
        assert_eq!(map.get(&NameKey::new(name(i).as_bytes())), Some(&i));
    }
    assert_eq!(map.get(&b"student:200000"[..]), None);
    let mean = 200_000 / NAME_SHARDS;
    for shard in map.shards.iter() {
        assert!(
            shard.len() > mean / 2 && shard.len() < mean * 2,
            "a shard of {} names against a mean of {mean}",
            shard.len()
        );
    }
}

/// Goal: a tag shard keeps each tag's positions apart and whole while its table grows through many
/// tags and batches. Method: many tags of many lengths spread over positions, added in a small
/// batch then a large one, each tag's list compared with the positions given.
#[test]
fn a_tag_shard_keeps_every_tag_apart_through_growth() {
    let hasher = TagHasher::new();
    let names: Vec<String> = (0..5000)
        .map(|i| format!("tag-{i}-{}", "x".repeat(i % 30)))
        .collect();
    let batch: Vec<ShardTag<'_>> = (0..20_000u64)
        .map(|p| {
            let name = names[(p * 7 % 5000) as usize].as_bytes();
            (hasher.hash(name), name, p + 1)
        })
        .collect();
    let mut shard = TagShard::default();
    shard.add_batch(&batch[..3]);
    shard.add_batch(&batch[3..]);
    assert_eq!(shard.names.len(), 5000);
    for (id, name) in shard.names.iter().enumerate() {
        let expected: Vec<u64> = batch
            .iter()
            .filter(|t| t.1 == name.as_bytes())
            .map(|t| t.2)
            .collect();
        assert_eq!(shard.postings[id], expected);
    }
}
