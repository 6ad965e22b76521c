"""What tools/mtp_agree_fixture.py and tools/mtp_nextn_fixture.py share:
copying a GGUF file's metadata into a writer, and writing it out
(the gguf-py of llama.cpp's source tree on PYTHONPATH)."""
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def copy_metadata(r: GGUFReader, w: GGUFWriter, edit) -> None:
    """Every key of `r` but the architecture (the writer has it) into `w`,
    each value through `edit(name, value)`."""
    arch = r.fields["general.architecture"].contents()
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = edit(name, f.contents())
        if name == "general.name":
            assert value != f.contents(), "a derived file names itself apart"
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(name, value, vtype, sub_type=sub)
    assert arch == w.arch


def write(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
