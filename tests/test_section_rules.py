"""The house style's section rules are padded by a tool, never by hand (tools/section_rules.py)."""

import section_rules


def test_a_rule_is_padded_to_the_line_limit_whatever_its_length(tmp_path):
    path = tmp_path / "module.py"
    path.write_text(
        "# -- short --\n"
        "    # -- indented, and far too long already " + "-" * 80 + "\n"
        "x = 1  # -- not a rule --\n"
    )
    assert section_rules.main(["--check", str(path)]) == 1  # both rules are off
    assert section_rules.main([str(path)]) == 0
    first, second, third = path.read_text().splitlines()
    assert len(first) == len(second) == section_rules.RULE_END
    assert first.startswith("# -- short -") and second.startswith("    # -- indented, and far")
    assert third == "x = 1  # -- not a rule --"
    assert section_rules.main(["--check", str(path)]) == 0


def test_a_title_that_leaves_no_room_is_reported_not_cut(tmp_path):
    path = tmp_path / "module.py"
    line = "# -- " + "word " * 19 + "--"
    path.write_text(line + "\n")
    assert section_rules.fix(path, check=False) == [
        f"{path}:1: the title leaves no room for 4 dashes"
    ]
    assert path.read_text() == line + "\n"
