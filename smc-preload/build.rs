//! Compiles `csrc/execl.c`: the variadic `execl`, `execle` and `execlp`, which stable Rust
//! cannot define (the exported names are naked functions in `src/hooks.rs` that jump there).

fn main() {
    println!("cargo:rerun-if-changed=csrc/execl.c");
    cc::Build::new()
        .file("csrc/execl.c")
        .flag_if_supported("-fvisibility=hidden")
        .warnings(true)
        .compile("smc_preload_execl");
}
