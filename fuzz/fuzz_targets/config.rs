#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sendledger_bench::fuzz::Target::Config.exercise(data);
});
