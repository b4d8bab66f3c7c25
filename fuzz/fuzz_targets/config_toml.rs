//! The config file layer: parsing and validation never panic.
#![no_main]

use herald_core::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_toml(text, "fuzz.toml") {
        Ok(config) => {
            let _ = config.validate();
        }
        Err(e) => {
            // Every error is printable (it is what the operator sees).
            let _ = e.to_string();
        }
    }
});
