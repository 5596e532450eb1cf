//! A read model's checkpoint file holding arbitrary bytes, read as a tool reads it
//! (`annals::readmodel::list_checkpoints`): every file answers a checkpoint or an error, never
//! a panic. Method: the input's first byte chooses whether the rest is written as it is (the
//! CRC then almost always fails) or followed by its own CRC32C, so that the decoder behind
//! the CRC check is reached.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&choice, body)) = input.split_first() else {
        return;
    };
    let mut file = body.to_vec();
    if choice % 2 == 0 {
        file.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let models = dir.path().join(annals::readmodel::CHECKPOINT_DIR);
    std::fs::create_dir_all(&models).expect("the checkpoint directory");
    std::fs::write(models.join("fuzzed.model"), &file).expect("the checkpoint file");
    let _ = annals::readmodel::list_checkpoints(dir.path());
});
