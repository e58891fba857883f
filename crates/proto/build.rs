//! Generates the gRPC code with the protoc that `protoc-bin-vendored` ships, so a fresh machine
//! needs no protoc install.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the environment.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=reprobench/v1/reprobench.proto");
    tonic_prost_build::configure().compile_protos(&["reprobench/v1/reprobench.proto"], &["."])?;
    Ok(())
}
