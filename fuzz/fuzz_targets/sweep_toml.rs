//! The sweep spec: `SweepSpec::from_toml` (TOML, the serde schema, then validation), and for a
//! spec it accepts, `to_toml` (stored with every run; it `expect`s to serialize).
//! Asserts nothing but "no panic, no hang, bounded memory".
#![no_main]

use libfuzzer_sys::fuzz_target;
use reprobench_domain::sweep::SweepSpec;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(spec) = SweepSpec::from_toml(&text) {
        let _ = spec.to_toml();
        let _ = spec.backbone_names();
    }
});
