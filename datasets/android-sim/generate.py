#!/usr/bin/env python3
"""Writes the self-made android-sim dataset (apps/*.json, reports/*.json, manifest.json).

The JSON files are what the harness reads; this script is only how they were written (the
ground-truth actions need full WidgetRef objects, which are tedious by hand). Run it from any
directory; it writes next to itself.
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

CLS = {
    "Button": "android.widget.Button",
    "Text": "android.widget.TextView",
    "Edit": "android.widget.EditText",
    "Image": "android.widget.ImageButton",
    "Check": "android.widget.CheckBox",
    "Recycler": "androidx.recyclerview.widget.RecyclerView",
}


def w(kind, wid, text="", bounds=(40, 200, 1040, 320), **kw):
    d = {"class": CLS[kind], "id": wid, "text": text, "bounds": list(bounds)}
    if kind in ("Button", "Image", "Check"):
        d["clickable"] = True
    if kind == "Edit":
        d["clickable"] = True
        d["long_clickable"] = True
    if kind == "Check":
        d["checkable"] = True
    if kind == "Recycler":
        d["scrollable"] = True
    d.update(kw)
    return d


def row(i, h=140, top=160):
    return (40, top + i * (h + 20), 1040, top + i * (h + 20) + h)


def cond(var, op, value=None):
    c = {"var": var, "op": op}
    if value is not None:
        c["value"] = value
    return c


def tr(screen, on, target=None, when=(), effects=()):
    t = {"screen": screen, "on": on, "when": list(when), "effects": list(effects)}
    if target is not None:
        t["target"] = target
    return t


def crash(screen, on, target, when, exception, message, frames):
    c = {"screen": screen, "on": on, "when": list(when), "exception": exception,
         "message": message, "frames": frames}
    if target is not None:
        c["target"] = target
    return c


def set_(var, value):
    return {"do": "set", "var": var, "value": value}


def go(screen):
    return {"do": "go", "screen": screen}


def replace(screen):
    return {"do": "replace", "screen": screen}


BACK = {"do": "back"}
UI = ["android.view.View.performClick(View.java:7448)",
      "android.view.View.performClickInternal(View.java:7425)",
      "android.view.View$PerformClick.run(View.java:28305)",
      "android.os.Handler.handleCallback(Handler.java:938)",
      "android.os.Looper.loop(Looper.java:223)",
      "android.app.ActivityThread.main(ActivityThread.java:7656)"]

APPS = {}

# 1. QuickNotes: notes list with long-click delete and a rotation-sensitive editor.
APPS["quicknotes"] = {
    "package": "com.example.quicknotes", "label": "QuickNotes", "launcher": "main",
    "vars": {"notes": ["Groceries"], "draft": "", "selected": ""},
    "persistent": ["notes"],
    "screens": [
        {"name": "main", "activity": ".ui.NotesListActivity", "widgets": [
            w("Text", "toolbar_title", "QuickNotes", (0, 60, 1080, 160)),
            w("Text", "note_count", "{#notes} notes", (40, 170, 1040, 230)),
            w("Recycler", "notes_list", "", (0, 240, 1080, 1500), list="notes",
              item_id="note_title", page=6),
            w("Button", "clear_all", "Clear all", (40, 1540, 500, 1660)),
            w("Image", "fab_add", "", (880, 1700, 1040, 1860), content_desc="Add note"),
        ]},
        {"name": "edit", "activity": ".ui.EditNoteActivity", "reset_on_rotate": ["draft"],
         "widgets": [
             w("Edit", "title_input", "", row(0), hint="Title", bind="draft"),
             w("Button", "save", "Save", (700, 1700, 1040, 1840)),
         ]},
        {"name": "confirm_delete", "activity": ".ui.NotesListActivity", "widgets": [
            w("Text", "alertTitle", "Delete \"{selected}\"?", (80, 700, 1000, 820)),
            w("Button", "button2", "Cancel", (400, 900, 680, 1000)),
            w("Button", "button1", "Delete", (700, 900, 1000, 1000)),
        ]},
    ],
    "transitions": [
        tr("main", "click", "fab_add", effects=[{"do": "clear", "var": "draft"}, go("edit")]),
        tr("edit", "click", "save", [cond("draft", "non_empty")],
           [{"do": "append", "var": "notes", "value": "{draft}"}, BACK]),
        tr("edit", "click", "save", [cond("draft", "empty")],
           [{"do": "append", "var": "notes", "value": "(untitled)"}, BACK]),
        tr("main", "long_click", "note_title", effects=[set_("selected", "{$text}"),
                                                          go("confirm_delete")]),
        tr("confirm_delete", "click", "button1",
           effects=[{"do": "remove", "var": "notes", "value": "{selected}"}, BACK]),
        tr("confirm_delete", "click", "button2", effects=[BACK]),
        tr("main", "click", "clear_all", [cond("notes", "non_empty")],
           [{"do": "clear", "var": "notes"}]),
    ],
    "crashes": [
        crash("main", "click", "clear_all", [cond("notes", "empty")],
              "java.lang.IndexOutOfBoundsException", "Index: 0, Size: 0",
              ["java.util.ArrayList.get(ArrayList.java:437)",
               "com.example.quicknotes.ui.NotesAdapter.getItem(NotesAdapter.java:58)",
               "com.example.quicknotes.ui.NotesListActivity.onClearAll(NotesListActivity.java:142)"]
              + UI),
    ],
}

# 2. TipSplit: bill, tip percentage, people; the selected tip is lost on rotation.
APPS["tipsplit"] = {
    "package": "com.example.tipsplit", "label": "TipSplit", "launcher": "main",
    "vars": {"bill": "", "tip": 15, "people": 1},
    "screens": [
        {"name": "main", "activity": ".MainActivity", "reset_on_rotate": ["tip"], "widgets": [
            w("Edit", "bill_input", "", row(0), hint="Bill amount", bind="bill"),
            w("Button", "tip_10", "10%", (40, 340, 340, 460)),
            w("Button", "tip_15", "15%", (390, 340, 690, 460)),
            w("Button", "tip_20", "20%", (740, 340, 1040, 460)),
            w("Text", "tip_percent", "Tip: {tip}%", (40, 480, 1040, 560)),
            w("Button", "people_minus", "-", (40, 600, 200, 720)),
            w("Text", "people_count", "{people}", (240, 600, 840, 720)),
            w("Button", "people_plus", "+", (880, 600, 1040, 720)),
            w("Button", "calculate", "Calculate", (40, 1700, 1040, 1840)),
        ]},
        {"name": "result", "activity": ".ResultActivity", "widgets": [
            w("Text", "tip_line", "Tip: {tip}% of {bill}", row(0)),
            w("Text", "split_line", "Split between {people}", row(1)),
        ]},
    ],
    "transitions": [
        tr("main", "click", "tip_10", effects=[set_("tip", 10)]),
        tr("main", "click", "tip_15", effects=[set_("tip", 15)]),
        tr("main", "click", "tip_20", effects=[set_("tip", 20)]),
        tr("main", "click", "people_minus", effects=[{"do": "add", "var": "people", "by": -1}]),
        tr("main", "click", "people_plus", effects=[{"do": "add", "var": "people", "by": 1}]),
        tr("main", "click", "calculate", [cond("bill", "non_empty")], [go("result")]),
    ],
    "crashes": [
        crash("main", "click", "calculate", [cond("bill", "non_empty"), cond("people", "lt", 1)],
              "java.lang.ArithmeticException", "divide by zero",
              ["com.example.tipsplit.SplitCalculator.perPerson(SplitCalculator.java:27)",
               "com.example.tipsplit.MainActivity.onCalculate(MainActivity.java:88)"] + UI),
    ],
}

# 3. Shopping list: a long list (swipe to reach the end) and a case-sensitive search.
ITEMS = ["Apples", "Bananas", "Bread", "Butter", "Carrots", "Cheese", "Coffee", "Eggs", "Flour",
         "Milk", "Pasta", "Rice", "Tomatoes", "Walnuts"]
APPS["shoplist"] = {
    "package": "com.example.shoplist", "label": "Shopping List", "launcher": "main",
    "vars": {"items": ITEMS, "query": "", "last": ""},
    "persistent": ["items"],
    "screens": [
        {"name": "main", "activity": ".ListActivity", "widgets": [
            w("Edit", "search", "", (40, 60, 1040, 180), hint="Search items", bind="query"),
            w("Text", "search_status", "", (40, 190, 1040, 250), visible_when=[
                cond("query", "non_empty")], variants=[
                {"when": [cond("query", "matches", "[A-Z]")], "text": "No results for \"{query}\""},
                {"when": [], "text": "Results for \"{query}\""}]),
            w("Recycler", "items", "", (0, 260, 1080, 1700), list="items", item_id="item_name",
              page=6),
            w("Text", "items_left", "{#items} items left", (40, 1720, 1040, 1800)),
        ]},
        {"name": "detail", "activity": ".ItemDetailActivity", "widgets": [
            w("Text", "item_title", "{last}", row(0)),
            w("Button", "mark_bought", "Mark as bought", row(1)),
        ]},
    ],
    "transitions": [
        tr("main", "click", "item_name", effects=[set_("last", "{$text}"), go("detail")]),
        tr("detail", "click", "mark_bought",
           effects=[{"do": "remove", "var": "items", "value": "{last}"}, BACK]),
    ],
    "crashes": [
        crash("main", "click", "Walnuts", [],
              "java.lang.ArrayIndexOutOfBoundsException", "length=14; index=14",
              ["com.example.shoplist.data.ItemStore.priceOf(ItemStore.java:73)",
               "com.example.shoplist.ItemAdapter$ViewHolder.onClick(ItemAdapter.java:112)"] + UI),
    ],
}

# 4. HabitFlow: statistics need a first check-in that nobody mentions; double check-in.
APPS["habitflow"] = {
    "package": "com.example.habitflow", "label": "HabitFlow", "launcher": "main",
    "vars": {"habits": [], "name": "", "current": "", "checkins": 0},
    "persistent": ["habits", "checkins"],
    "screens": [
        {"name": "main", "activity": ".MainActivity", "widgets": [
            w("Text", "empty_view", "No habits yet. Tap + to add one.", row(0),
              visible_when=[cond("habits", "empty")]),
            w("Recycler", "habit_list", "", (0, 160, 1080, 1600), list="habits",
              item_id="habit_name"),
            w("Image", "add_habit", "", (880, 1700, 1040, 1860), content_desc="Add habit"),
        ]},
        {"name": "new_habit", "activity": ".NewHabitActivity", "widgets": [
            w("Edit", "habit_name_input", "", row(0), hint="Habit name", bind="name"),
            w("Button", "save_habit", "Save", row(1)),
        ]},
        {"name": "habit", "activity": ".HabitDetailActivity", "widgets": [
            w("Text", "habit_title", "{current}", row(0)),
            w("Button", "check_in", "Check in today", row(1)),
            w("Text", "streak", "Streak: {checkins} days", row(2)),
            w("Button", "stats", "Statistics", row(3)),
        ]},
        {"name": "stats", "activity": ".stats.StatsActivity", "widgets": [
            w("Text", "stats_summary", "{checkins} check-ins this week", row(0)),
        ]},
    ],
    "transitions": [
        tr("main", "click", "add_habit", effects=[{"do": "clear", "var": "name"}, go("new_habit")]),
        tr("new_habit", "click", "save_habit", [cond("name", "non_empty")],
           [{"do": "append", "var": "habits", "value": "{name}"}, BACK]),
        tr("main", "click", "habit_name", effects=[set_("current", "{$text}"), go("habit")]),
        tr("habit", "click", "check_in", effects=[{"do": "add", "var": "checkins", "by": 1}]),
        tr("habit", "click", "stats", effects=[go("stats")]),
    ],
    "crashes": [
        crash("habit", "click", "stats", [cond("checkins", "eq", 0)],
              "java.lang.NullPointerException",
              "Attempt to invoke virtual method 'long java.util.Date.getTime()' on a null object reference",
              ["com.example.habitflow.stats.WeekStats.compute(WeekStats.java:41)",
               "com.example.habitflow.stats.StatsActivity.onCreate(StatsActivity.java:36)",
               "android.app.Activity.performCreate(Activity.java:8000)",
               "android.app.ActivityThread.performLaunchActivity(ActivityThread.java:3422)",
               "android.os.Looper.loop(Looper.java:223)",
               "android.app.ActivityThread.main(ActivityThread.java:7656)"]),
    ],
}

# 5. PocketBudget: onboarding, an account, a transaction — long paths.
APPS["pocketbudget"] = {
    "package": "com.example.pocketbudget", "label": "PocketBudget", "launcher": "welcome1",
    "vars": {"account": "", "account_draft": "", "balance": "", "balance_draft": "",
             "amount": "", "category": "", "txs": []},
    "screens": [
        {"name": "welcome1", "activity": ".onboarding.OnboardingActivity", "widgets": [
            w("Text", "headline", "Track every expense", row(2)),
            w("Button", "next", "Next", (700, 1700, 1040, 1840))]},
        {"name": "welcome2", "activity": ".onboarding.OnboardingActivity", "widgets": [
            w("Text", "headline", "Set a monthly goal", row(2)),
            w("Button", "next", "Next", (700, 1700, 1040, 1840))]},
        {"name": "welcome3", "activity": ".onboarding.OnboardingActivity", "widgets": [
            w("Text", "headline", "You're all set", row(2)),
            w("Button", "get_started", "Get started", (540, 1700, 1040, 1840))]},
        {"name": "accounts", "activity": ".accounts.AccountsActivity", "widgets": [
            w("Text", "no_accounts", "Add your first account", row(0),
              visible_when=[cond("account", "empty")]),
            w("Text", "account_row", "{account}: {balance}", row(0), clickable=True,
              visible_when=[cond("account", "non_empty")]),
            w("Button", "add_account", "Add account", (40, 1700, 1040, 1840))]},
        {"name": "new_account", "activity": ".accounts.NewAccountActivity", "widgets": [
            w("Edit", "account_name", "", row(0), hint="Account name", bind="account_draft"),
            w("Edit", "opening_balance", "", row(1), hint="Opening balance",
              bind="balance_draft"),
            w("Button", "save_account", "Save", row(2))]},
        {"name": "account", "activity": ".accounts.AccountDetailActivity", "widgets": [
            w("Text", "account_title", "{account}", row(0)),
            w("Text", "balance_label", "Balance: {balance}", row(1), variants=[
                {"when": [cond("txs", "non_empty"), cond("category", "empty")],
                 "text": "Balance: NaN"}]),
            w("Recycler", "tx_list", "", (0, 500, 1080, 1600), list="txs", item_id="tx_row"),
            w("Image", "add_tx", "", (880, 1700, 1040, 1860), content_desc="Add transaction")]},
        {"name": "new_tx", "activity": ".transactions.NewTransactionActivity", "widgets": [
            w("Edit", "amount_input", "", row(0), hint="Amount", bind="amount"),
            w("Text", "category_label", "Category: {category}", row(1)),
            w("Button", "cat_food", "Food", (40, 520, 340, 640)),
            w("Button", "cat_rent", "Rent", (390, 520, 690, 640)),
            w("Button", "cat_other", "Other", (740, 520, 1040, 640)),
            w("Button", "save_tx", "Save", (700, 1700, 1040, 1840))]},
    ],
    "transitions": [
        tr("welcome1", "click", "next", effects=[replace("welcome2")]),
        tr("welcome2", "click", "next", effects=[replace("welcome3")]),
        tr("welcome3", "click", "get_started", effects=[replace("accounts")]),
        tr("accounts", "click", "add_account", effects=[go("new_account")]),
        tr("new_account", "click", "save_account", [cond("account_draft", "non_empty")],
           [set_("account", "{account_draft}"), set_("balance", "{balance_draft}"), BACK]),
        tr("accounts", "click", "account_row", effects=[go("account")]),
        tr("account", "click", "add_tx", effects=[{"do": "clear", "var": "amount"},
                                                   {"do": "clear", "var": "category"},
                                                   go("new_tx")]),
        tr("new_tx", "click", "cat_food", effects=[set_("category", "Food")]),
        tr("new_tx", "click", "cat_rent", effects=[set_("category", "Rent")]),
        tr("new_tx", "click", "cat_other", effects=[set_("category", "Other")]),
        tr("new_tx", "click", "save_tx", [cond("amount", "non_empty")],
           [{"do": "append", "var": "txs", "value": "{amount} {category}"}, BACK]),
    ],
    "crashes": [
        crash("new_tx", "click", "save_tx", [cond("amount", "contains", ",")],
              "java.lang.NumberFormatException", "For input string: \"{amount}\"",
              ["jdk.internal.math.FloatingDecimal.readJavaFormatString(FloatingDecimal.java:2054)",
               "java.lang.Double.parseDouble(Double.java:549)",
               "com.example.pocketbudget.transactions.NewTransactionActivity.onSave(NewTransactionActivity.java:97)"]
              + UI),
    ],
}

# 6. SkyCast: city search (Enter on an empty field) and a unit setting that is not applied.
APPS["skycast"] = {
    "package": "com.example.skycast", "label": "SkyCast", "launcher": "main",
    "vars": {"city": "Berlin", "query": "", "fahrenheit": False},
    "persistent": ["fahrenheit"],
    "screens": [
        {"name": "main", "activity": ".MainActivity", "widgets": [
            w("Edit", "search_city", "", (40, 60, 860, 180), hint="Search city", bind="query"),
            w("Image", "open_settings", "", (900, 60, 1040, 180), content_desc="Settings"),
            w("Text", "city_name", "{city}", row(1)),
            w("Text", "temperature", "21°C", row(2), variants=[
                {"when": [cond("fahrenheit", "eq", True)], "text": "21°F"}]),
        ]},
        {"name": "settings", "activity": ".SettingsActivity", "widgets": [
            w("Check", "use_fahrenheit", "Use Fahrenheit", row(0), bind="fahrenheit"),
        ]},
    ],
    "transitions": [
        tr("main", "click", "open_settings", effects=[go("settings")]),
        tr("main", "enter", None, [cond("query", "non_empty")],
           [set_("city", "{query}"), {"do": "clear", "var": "query"}]),
    ],
    "crashes": [
        crash("main", "enter", None, [cond("query", "empty")],
              "java.lang.StringIndexOutOfBoundsException", "length=0; index=0",
              ["java.lang.String.charAt(String.java:58)",
               "com.example.skycast.search.CityQuery.normalize(CityQuery.java:19)",
               "com.example.skycast.MainActivity.onEditorAction(MainActivity.java:131)",
               "android.widget.TextView.onEditorAction(TextView.java:6739)",
               "android.os.Looper.loop(Looper.java:223)"]),
    ],
}


def ref(app, wid="", text="", desc="", kind="Button"):
    pkg = APPS[app]["package"]
    return {"resource_id": f"{pkg}:id/{wid}" if wid else "", "text": text, "content_desc": desc,
            "class": CLS[kind], "bounds": {"left": 0, "top": 0, "right": 0, "bottom": 0}}


def click(app, wid="", text="", desc="", kind="Button"):
    return {"action": "click", "target": ref(app, wid, text, desc, kind)}


def long_click(app, wid="", text="", kind="Text"):
    return {"action": "long_click", "target": ref(app, wid, text, kind=kind)}


def type_(app, wid, text):
    return {"action": "input_text", "target": ref(app, wid, kind="Edit"), "text": text}


def press(key):
    return {"action": "press", "key": key}


def swipe(app, wid, direction="up"):
    return {"action": "swipe", "direction": direction, "target": ref(app, wid, kind="Recycler")}


ROTATE = {"action": "rotate"}


def report(rid, app, kind, title, body, comments, truth, wrong, exception=None, symptom=None):
    a = APPS[app]
    r = {"apk_name": f"{a['package']}.apk",
         "url": f"sim://android-sim/{app}/issues/{rid}",
         "repo": a["label"].replace(" ", ""), "title": title, "body": body,
         "comments": comments, "type": kind, "app": app, "ground_truth": truth,
         "near_miss": wrong}
    if exception:
        r["exception"] = exception
    if symptom:
        r["symptom"] = {"resource_id": f"{a['package']}:id/{symptom[0]}", "text": symptom[1]}
    return r


def budget_prefix(amount):
    b = "pocketbudget"
    return [click(b, "next", "Next"), click(b, "next", "Next"),
            click(b, "get_started", "Get started"), click(b, "add_account", "Add account"),
            type_(b, "account_name", "Wallet"), type_(b, "opening_balance", "250"),
            click(b, "save_account", "Save"), click(b, "account_row", "Wallet: 250", kind="Text"),
            click(b, "add_tx", desc="Add transaction", kind="Image"),
            type_(b, "amount_input", amount)]


def new_habit(name):
    h = "habitflow"
    return [click(h, "add_habit", desc="Add habit", kind="Image"),
            type_(h, "habit_name_input", name), click(h, "save_habit", "Save"),
            click(h, "habit_name", name, kind="Text")]


N, T, S, B = "quicknotes", "tipsplit", "shoplist", "habitflow"
REPORTS = [
    report("1", N, "crash", "Crash after deleting my only note",
           "I had just one note. I long-pressed it and deleted it, then I tapped \"Clear all\" "
           "to be sure everything was gone and the app closed itself.\n\n"
           "**Expected:** nothing happens, the list is already empty.\n"
           "**Actual:** QuickNotes has stopped.\n\nAndroid 11, QuickNotes 2.3.1",
           ["Can confirm, same on Android 13.", "Thanks, the adapter assumes at least one item."],
           [long_click(N, "note_title", "Groceries"), click(N, "button1", "Delete"),
            click(N, "clear_all", "Clear all")],
           [click(N, "clear_all", "Clear all")],
           exception="java.lang.IndexOutOfBoundsException"),
    report("2", N, "non-crash", "Note title gone when phone rotates",
           "Typed a title for a new note, turned the phone to landscape to see better, pressed "
           "save. The note in the list is called \"(untitled)\". Happens every time.",
           [],
           [click(N, "fab_add", desc="Add note", kind="Image"),
            type_(N, "title_input", "Meeting notes"), ROTATE, click(N, "save", "Save")],
           [click(N, "fab_add", desc="Add note", kind="Image"),
            type_(N, "title_input", "Meeting notes"), click(N, "save", "Save")],
           symptom=("note_title", "(untitled)")),
    report("3", T, "crash", "crash when splitting",
           "app crashes when i press calculate. i put the bill and changed the people. "
           "worked yesterday",
           ["Which numbers did you enter?", "bill 60, I think I pressed minus once"],
           [type_(T, "bill_input", "60"), click(T, "people_minus", "-"),
            click(T, "calculate", "Calculate")],
           [type_(T, "bill_input", "60"), click(T, "people_plus", "+"),
            click(T, "people_minus", "-"), click(T, "calculate", "Calculate")],
           exception="java.lang.ArithmeticException"),
    report("4", T, "non-crash", "Tip goes back to 15% after rotating",
           "Steps: enter 80 as the bill, choose 20%, rotate the device, press Calculate.\n"
           "The result says \"Tip: 15% of 80\" although I selected 20%.",
           ["The selection should survive configuration changes (onSaveInstanceState)."],
           [type_(T, "bill_input", "80"), click(T, "tip_20", "20%"), ROTATE,
            click(T, "calculate", "Calculate")],
           [type_(T, "bill_input", "80"), click(T, "tip_20", "20%"),
            click(T, "calculate", "Calculate")],
           symptom=("tip_line", "Tip: 15% of 80")),
    report("5", S, "crash", "Last item in the list crashes the app",
           "If I scroll all the way down and tap the last thing on my list the app crashes. "
           "Other items open fine.",
           ["Sounds like an off-by-one in the price lookup."],
           [swipe(S, "items"), swipe(S, "items"), click(S, "item_name", "Walnuts", kind="Text")],
           [click(S, "item_name", "Apples", kind="Text")],
           exception="java.lang.ArrayIndexOutOfBoundsException"),
    report("6", S, "non-crash", "Search finds nothing",
           "Searching for Milk says no results even though milk is on my list.",
           ["Lower case works for me, maybe it is case sensitive?"],
           [type_(S, "search", "Milk")],
           [type_(S, "search", "milk")],
           symptom=("search_status", "No results for \"Milk\"")),
    report("7", B, "crash", "Statistics crash",
           "Opening Statistics on a habit crashes HabitFlow. Fresh install, Pixel 6.",
           ["Works for me on my old habits.", "Happens only for a brand-new habit for me."],
           new_habit("Read") + [click(B, "stats", "Statistics")],
           new_habit("Read") + [click(B, "check_in", "Check in today"),
                                click(B, "stats", "Statistics")],
           exception="java.lang.NullPointerException"),
    report("8", B, "non-crash", "Streak counts the same day twice",
           "I accidentally tapped 'Check in today' twice and now my streak says 2 days although "
           "I only started today. The button should not count twice.",
           [],
           new_habit("Stretch") + [click(B, "check_in", "Check in today"),
                                   click(B, "check_in", "Check in today")],
           new_habit("Stretch") + [click(B, "check_in", "Check in today")],
           symptom=("streak", "Streak: 2 days")),
    report("9", "pocketbudget", "crash", "Crash when saving an expense with decimals",
           "After the intro I created an account (Wallet, 250) and tried to add my lunch, "
           "12,50. On save the app crashed. My phone is set to German.",
           ["Decimal comma is not handled, parseDouble needs a locale-aware parser."],
           budget_prefix("12,50") + [click("pocketbudget", "cat_food", "Food"),
                                     click("pocketbudget", "save_tx", "Save")],
           budget_prefix("12.50") + [click("pocketbudget", "cat_food", "Food"),
                                     click("pocketbudget", "save_tx", "Save")],
           exception="java.lang.NumberFormatException"),
    report("10", "pocketbudget", "non-crash", "Balance shows NaN",
           "Balance on my account page shows NaN after adding an expense. Not sure what I did "
           "differently.",
           ["I get it when I forget to pick a category."],
           budget_prefix("20") + [click("pocketbudget", "save_tx", "Save")],
           budget_prefix("20") + [click("pocketbudget", "cat_rent", "Rent"),
                                  click("pocketbudget", "save_tx", "Save")],
           symptom=("balance_label", "Balance: NaN")),
    report("11", "skycast", "crash", "Keyboard search crashes",
           "Tapping the search box and pressing the search/enter key on the keyboard without "
           "typing anything makes SkyCast crash.",
           [],
           [click("skycast", "search_city", kind="Edit"), press("enter")],
           [type_("skycast", "search_city", "Paris"), press("enter")],
           exception="java.lang.StringIndexOutOfBoundsException"),
    report("12", "skycast", "non-crash", "Fahrenheit setting shows wrong temperature",
           "When I switch to Fahrenheit in the settings the main screen shows 21°F. It is not "
           "freezing outside, the number is still the Celsius value.",
           ["Unit label changes but the value is not converted."],
           [click("skycast", "open_settings", desc="Settings", kind="Image"),
            click("skycast", "use_fahrenheit", "Use Fahrenheit", kind="Check"), press("back")],
           [click("skycast", "open_settings", desc="Settings", kind="Image"), press("back")],
           symptom=("temperature", "21°F")),
]


def dump(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main():
    os.makedirs(os.path.join(HERE, "apps"), exist_ok=True)
    os.makedirs(os.path.join(HERE, "reports"), exist_ok=True)
    dump(os.path.join(HERE, "manifest.json"),
         {"name": "android-sim", "track": "android", "apps": "apps", "reports": "reports"})
    for name, app in APPS.items():
        dump(os.path.join(HERE, "apps", f"{name}.json"), app)
    for i, r in enumerate(REPORTS, 1):
        dump(os.path.join(HERE, "reports", f"{r['app']}-{i:02}.json"), r)


if __name__ == "__main__":
    main()
