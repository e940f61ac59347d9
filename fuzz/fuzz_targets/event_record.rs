#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sendledger::bench_fuzz::Target::EventRecord.exercise(data);
});
