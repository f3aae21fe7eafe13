fn main() {
    let _u = asap_train::comm::init().unwrap();
    println!("asap-train skeleton");
}
