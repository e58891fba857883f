//! The test-log parsers: every family, looked up by its name as environment specs and
//! `case.json` give it (SWT-bench's seven, and `unittest`), under both grading rule sets.
//! Asserts nothing but "no panic, no hang, bounded memory".
#![no_main]

use libfuzzer_sys::fuzz_target;
use reprobench_swt::grading::{Family, Rules};

fuzz_target!(|data: &[u8]| {
    let log = String::from_utf8_lossy(data);
    for name in Family::names() {
        let family = Family::from_name(name).expect("a listed family name");
        for rules in Rules::ALL {
            let _ = family.parse(&log, rules);
        }
    }
});
