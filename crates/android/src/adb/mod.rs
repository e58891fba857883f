//! The real-device backend: Android emulators and phones driven through the `adb` command
//! line and the emulator console. Parsing lives in pure modules (`uiautomator`, `logcat`,
//! `commands`); `adb`, `console` and `pool` do the IO.

#[allow(clippy::module_inception)] // `adb::adb` is the AdbDevice, named after the tool it drives.
pub mod adb;
pub mod commands;
pub mod console;
pub mod logcat;
pub mod pool;
pub mod uiautomator;

#[cfg(test)]
pub(crate) fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/android")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}
