//! A read model's checkpoint file holding arbitrary bytes, read as a tool reads it
//! (`annals::readmodel::list_checkpoints`): every file answers a checkpoint or an error, never
//! a panic. Method: the input's first byte chooses whether the rest is written as it is (the
//! CRC then almost always fails) or followed by its own CRC32C, so that the decoder behind
//! the CRC check is reached.
//! The body is annals_fuzz_targets::readmodel_checkpoint, which the test command replays from this target's
//! corpus on the stable toolchain.

#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| annals_fuzz_targets::readmodel_checkpoint(input));
