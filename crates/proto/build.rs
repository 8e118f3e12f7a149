//! Compiles the envd `.proto` files with protox (pure Rust, no `protoc` needed), then generates
//! prost message types and pbjson serde impls (the proto3 JSON mapping the SDK's JSON codec uses).
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/process/process.proto",
        "proto/filesystem/filesystem.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_bytes = prost::Message::encode_to_vec(&fds);
    let descriptor_path = out.join("envd_descriptor.bin");
    std::fs::write(&descriptor_path, &descriptor_bytes)?;

    prost_build::Config::new()
        .compile_well_known_types()
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_fds(fds)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_bytes)?
        .ignore_unknown_fields()
        .build(&[".process", ".filesystem"])?;
    Ok(())
}
