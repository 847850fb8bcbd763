"""Section 44: the rule in seed 4 started from the byte model that seed 4's learned runs started from (the
experiment patch `seed4/rule_learned_start/init_as.patch`; the seed's data order), against the seed's rule, its
paper-estimator run and that run redrawn, on the same held-out text: compare's 64 sequences, all 418 packed val
sequences (differences paired over them) and all 89 val documents.

    python learned_start.py > seed4/rule_learned_start/table.md      (run in this folder)
"""
import importlib.util
from pathlib import Path

here = Path(__file__).parent
spec = importlib.util.spec_from_file_location("section39_table", here / "paper_seeds.py")
section39 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(section39)
section27 = section39.section27

NAMES = {**section39.NAMES, "paper_redrawn": "the paper's estimator, other boundary draws (section 39)",
         "rule_learned_start": "word starts + probe, the learned runs' byte model (this section)"}
SHORT = {**section39.SHORT, "rule_learned_start": "word starts, learned start"}

if __name__ == "__main__":
    runs = section39.runs(4)
    runs["rule_learned_start"] = section27.folder_scores(here / "seed4" / "rule_learned_start", "*.json")
    section27.print_tables({4: runs}, NAMES, SHORT, (("rule_learned_start", "rule"), ("paper", "rule_learned_start"),
                                                     ("paper_redrawn", "rule_learned_start")))
