//! Every input boundary against generated inputs (`sendledger-bench fuzz`, a short run with a
//! fixed seed), against the saved hostile inputs of `tests/fixtures/fuzz/<target>/` (inputs a
//! fuzzer found crashing, kept as regression cases, and hand-made ones at the edges: lengths of
//! 2^60, nesting 100,000 deep, numbers of 100,000 digits), and the event decoder against length
//! prefixes no input can back.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sendledger_bench::fuzz::{fuzz, replay, Budget, Target};
use sendledger_store::envelope::decode_event;

#[test]
fn every_boundary_answers_generated_inputs_without_panicking() {
    let seed = crate::seed(1);
    for target in Target::ALL {
        let run = fuzz(target, Budget::Iterations(20_000), seed);
        assert_eq!(run.executions, 20_000);
        let findings: Vec<String> = run
            .findings
            .iter()
            .take(3)
            .map(|f| format!("{}\n  input (hex): {}", f.message, hex(&f.input)))
            .collect();
        assert!(
            run.findings.is_empty(),
            "{}: {} of 20000 inputs panicked, e.g.:\n{}",
            target.name(),
            run.findings.len(),
            findings.join("\n")
        );
    }
}

#[test]
fn saved_hostile_inputs_are_answered_without_panicking() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/fuzz");
    let mut replayed = 0;
    for target_dir in std::fs::read_dir(dir).unwrap() {
        let target_dir = target_dir.unwrap().path();
        let name = target_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let target = Target::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .unwrap_or_else(|| panic!("{name} in {dir} is not a fuzz target"));
        for file in std::fs::read_dir(&target_dir).unwrap() {
            let path = file.unwrap().path();
            let input = std::fs::read(&path).unwrap();
            if let Err(message) = replay(target, &input) {
                panic!("{}: {message}", path.display());
            }
            replayed += 1;
        }
    }
    assert!(replayed > 0, "no saved inputs under {dir}");
}

#[test]
fn a_length_prefix_no_input_can_back_allocates_at_most_a_mebibyte() {
    // Every 8 bytes of every stored event, read as a length or count, set to lengths that
    // would need terabytes: bincode checks a string's length against the input, and serde
    // preallocates at most 1 MiB for a sequence whatever length it announces.
    let events = Target::Event.seeds();
    let (mut decoded, mut peak) = (0, 0);
    for bytes in &events {
        let lsn = u64::from_le_bytes(bytes[1..9].try_into().unwrap());
        for at in 9..bytes.len().saturating_sub(8) {
            for len in [1u64 << 40, 1 << 60, u64::MAX] {
                let mut bytes = bytes.clone();
                bytes[at..at + 8].copy_from_slice(&len.to_le_bytes());
                LARGEST.set(0);
                let result = decode_event(lsn, &bytes);
                let largest = LARGEST.get();
                assert!(
                    largest <= 1 << 20,
                    "{largest} bytes allocated at once for {} input bytes (length {len} at {at})",
                    bytes.len()
                );
                decoded += result.is_ok() as u32;
                peak = peak.max(largest);
            }
        }
    }
    // Overwriting a number or a hash still decodes; a sequence's count (`matches`,
    // `remote_ids`) reaches serde's preallocation cap: the bound above is met, not vacuous.
    assert!(decoded > 0);
    assert!(peak > 1 << 19, "largest allocation {peak}");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

thread_local! {
    /// The largest single allocation this thread asked for since it was reset.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, recording each thread's largest allocation.
struct RecordLargest;

// SAFETY: every call is forwarded to `System` unchanged; the bookkeeping allocates nothing.
unsafe impl GlobalAlloc for RecordLargest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

fn record(size: usize) {
    let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
}

#[global_allocator]
static ALLOCATOR: RecordLargest = RecordLargest;
