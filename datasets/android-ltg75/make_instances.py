#!/usr/bin/env python3
"""Regenerates instances.jsonl from the LTGDroid paper's Table III and the report files' facts.

Usage: python3 make_instances.py TABLE3_CSV REPORTS_DIR > instances.jsonl
Only facts are kept (ids, app, bug type, ground-truth action count, issue URL, APK file name);
the report texts stay out of the repository.
"""
import csv
import json
import sys

table, reports = sys.argv[1], sys.argv[2]
for row in csv.DictReader(open(table)):
    report_id = row["report"]
    app, _ = report_id.split("#")
    rep = json.load(open(f"{reports}/{report_id}.json"))
    out = {
        "instance_id": report_id.replace("#", "-"),
        "paper_id": int(row["id"]),
        "report_id": report_id,
        "app": app,
        "bug_type": row["type"],
        "ground_truth_actions": int(row["ground_truth_actions"]) if row["ground_truth_actions"] else None,
        "issue_url": rep["url"],
        "apk": rep["apk_name"],
    }
    print(json.dumps(out))
