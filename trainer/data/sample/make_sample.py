"""Writes the shipped sample data set (deterministic; run it to regenerate the files here).

    python -m trainer.data.sample.make_sample

Nine invented users, three per task, each with a clearly distinct writing habit, 11 items
(10 history + 1 target), 5 baseline outputs on the target (methods as in PARL: Non, RAG, SFT,
GRPO, SFT+GRPO), a hand-written rubric of the user's habits, and NLI constraints (answer =
what the target is about, preference = what this user cares about). The texts are written for
this project; no real data set is included.
"""

# ruff: noqa: E501  (sample texts are data, kept on one line each)
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
METHODS = ("Non", "RAG", "SFT", "GRPO", "SFT+GRPO")

PRODUCTS = [
    ("Bamboo Cutting Board Set", "Three boards of organic bamboo with juice grooves.", "Kitchen"),
    ("Stainless Steel Water Bottle", "Double-wall insulated, keeps drinks cold for 24 hours.", "Outdoors"),
    ("Wireless Earbuds", "Bluetooth 5.3 earbuds with a charging case and touch controls.", "Audio"),
    ("Cotton Bath Towels", "Set of four thick towels, machine washable.", "Home"),
    ("LED Desk Lamp", "Dimmable lamp with five color modes and a USB port.", "Office"),
    ("Yoga Mat", "Non-slip mat, six millimeters thick, with a carry strap.", "Fitness"),
    ("Cast Iron Skillet", "Pre-seasoned ten inch skillet for stove and oven.", "Kitchen"),
    ("Backpack Rain Cover", "Waterproof cover that fits bags from 20 to 35 liters.", "Outdoors"),
    ("Electric Kettle", "1.7 liter kettle with auto shut-off and a glass body.", "Kitchen"),
    ("Phone Tripod", "Extendable tripod with a remote shutter for phones.", "Photo"),
    ("Wool Hiking Socks", "Merino blend socks with cushioned soles, three pairs.", "Outdoors"),
]
ARTICLES = [
    ("city council", "The city council voted on Tuesday to expand the bike lane network by 40 kilometers over three years, citing rising commuter demand and a drop in traffic injuries."),
    ("heat wave", "Forecasters warned that a heat wave will push temperatures above 38 degrees this weekend, and officials opened 12 cooling centers across the region."),
    ("school lunches", "A new state program will fund free school lunches for 2 million students starting next fall, after lawmakers reached a budget deal late on Friday."),
    ("electric buses", "The transit agency unveiled 50 electric buses that it says will cut fuel costs by half and reduce noise on the busiest downtown routes."),
    ("library hours", "Public libraries will stay open until 10 pm on weekdays after a pilot showed evening visits doubled among students and shift workers."),
    ("housing prices", "Median housing prices fell 4 percent in the last quarter, the first decline in six years, as mortgage rates stayed near a two-decade high."),
    ("river cleanup", "Volunteers removed 9 tons of trash from the river during a weekend cleanup, the largest turnout since the event began in 2010."),
    ("vaccine clinic", "Health officials will run a mobile vaccine clinic in 15 rural towns this month to reach residents who live far from pharmacies."),
    ("startup funding", "Local startups raised 300 million dollars in venture funding this year, led by climate technology and health software companies."),
    ("museum reopening", "The natural history museum reopens on Saturday after a 2 year renovation that added a new dinosaur hall and a rooftop garden."),
    ("water rates", "Residents will see water rates rise 7 percent in January to pay for replacing aging pipes, the utility board decided on Monday."),
]
TOPICS = [
    ("moving to a new city alone", "moving"), ("learning to bake sourdough", "baking"),
    ("switching careers at 35", "career"), ("adopting a rescue dog", "dog"),
    ("training for a first marathon", "running"), ("building a budget PC", "pc"),
    ("dealing with a noisy neighbor", "neighbor"), ("starting a balcony garden", "garden"),
    ("learning guitar as an adult", "guitar"), ("planning a solo trip to Japan", "travel"),
    ("paying off student loans", "loans"),
]

# Amazon reviewers: (user_id, review writer, rating, title writer, preference, rules)
Writer = Callable[[int, str, str], str]


def _honest(i: int, name: str, cat: str) -> str:
    return (f"Honestly, this {name.lower()} blew me away! My kids use it every single day and "
            f"it still looks brand new. Setup took two minutes! Five stars from me!")


def _analyst(i: int, name: str, cat: str) -> str:
    return (f"Pros: this {name.lower()} has a solid build for a {cat.lower()} item. "
            f"Cons: packaging was excessive. Verdict: good price-to-value ratio, "
            f"{3 + i % 3} out of 5 on durability after {i + 2} weeks.")


def _terse(i: int, name: str, cat: str) -> str:
    return f"works fine. shipping was fast. {name.lower()} is ok for the money. would buy again."


AMAZON_USERS: list[dict[str, Any]] = [
    {"user_id": "amz_enthusiast", "writer": _honest, "rating": 5, "title": "Love it!",
     "preference": "kids", "rules": [
         'The review opens with the word "Honestly".',
         'The review mentions "my kids" using the product.',
         'The review ends with the phrase "Five stars from me".',
         'The review says the product looks "brand new" after use.']},
    {"user_id": "amz_analyst", "writer": _analyst, "rating": 4, "title": "Balanced take",
     "preference": "value", "rules": [
         'The review has a section labelled "Pros".',
         'The review has a section labelled "Cons".',
         'The review ends with a "Verdict" section.',
         'The review judges the "price-to-value" of the product.']},
    {"user_id": "amz_terse", "writer": _terse, "rating": 3, "title": "ok",
     "preference": "shipping", "rules": [
         'The review comments on the "shipping" speed.',
         'The review closes with "would buy again".',
         'The review calls the product "ok for the money".']},
]

NEWS_USERS: list[dict[str, Any]] = [
    {"user_id": "news_questioner", "headline": lambda t, a: f"Is the {t} plan really worth it?",
     "preference": "worth", "rules": [
         'The headline is phrased as a question starting with "Is the".',
         'The headline asks whether something is "really worth it".']},
    {"user_id": "news_breaking", "headline": lambda t, a: f"Breaking: {t.title()} news, {_num(a)} key facts",
     "preference": "key facts", "rules": [
         'The headline starts with the label "Breaking".',
         'The headline promises a number of "key facts".']},
    {"user_id": "news_howto", "headline": lambda t, a: f"How to make sense of the {t} story in 3 steps",
     "preference": "steps", "rules": [
         'The headline begins with "How to".',
         'The headline promises "3 steps".']},
]

REDDIT_USERS: list[dict[str, Any]] = [
    {"user_id": "rd_lurker", "post": lambda t, k: (
        f"Long-time lurker, first post. I have been {t} for a few months and wanted to share what "
        f"worked. The hardest part was the first week, honestly. Edit: thanks for the replies! "
        f"TL;DR: {k} is hard but worth it."),
     "preference": "lurker", "rules": [
         'The post opens with "Long-time lurker".',
         'The post contains an "Edit" note thanking readers.',
         'The post ends with a "TL;DR" summary.']},
    {"user_id": "rd_formal", "post": lambda t, k: (
        f"In my experience, {t} requires careful planning. I would recommend setting a clear "
        f"schedule and tracking progress weekly. Consequently, the results become measurable. "
        f"Thoughts?"),
     "preference": "planning", "rules": [
         'The post begins with "In my experience".',
         'The post recommends "tracking progress".',
         'The post ends by asking "Thoughts?"']},
    {"user_id": "rd_throwaway", "post": lambda t, k: (
        f"Throwaway account for obvious reasons. Situation with {k}:\n- I started {t}\n"
        f"- it is going worse than expected\n- I do not know who to ask\n"
        f"Any advice appreciated."),
     "preference": "advice", "rules": [
         'The post starts with "Throwaway account".',
         'The post lists its points as bullet items.',
         'The post closes with "Any advice appreciated".']},
]


def _num(article: str) -> int:
    return 3 + len(article) % 5


def _amazon() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    users, extra = [], []
    for u, spec in enumerate(AMAZON_USERS):
        items = []
        for i in range(11):
            name, desc, cat = PRODUCTS[(i + 4 * u) % len(PRODUCTS)]
            items.append({"asin": f"B0SAMPLE{u}{i:02d}", "item_title": name, "description": desc,
                          "rating": spec["rating"], "title": spec["title"],
                          "text": spec["writer"](i, name, cat)})
        users.append({"user_id": spec["user_id"], "category": "Sample", "profile": items[:10],
                      "data": items[10]})
        target = items[10]
        extra.append(_extras(spec, target["item_title"], [
            f"This {target['item_title'].lower()} is a good product. It works as described.",
            f"The {target['item_title'].lower()} arrived on time and matches the description.",
            f"Great {target['item_title'].lower()}. Would recommend to anyone.",
            f"Honestly, a decent {target['item_title'].lower()}. It does the job.",
            f"Solid {target['item_title'].lower()} and easy to use. Happy with it overall.",
        ]))
    return users, extra


def _news() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    users, extra = [], []
    for u, spec in enumerate(NEWS_USERS):
        items = []
        for i in range(11):
            topic, article = ARTICLES[(i + 3 * u) % len(ARTICLES)]
            items.append({"text": article, "title": spec["headline"](topic, article),
                          "id": f"{spec['user_id']}-{i}"})
        target = items[10]
        topic = ARTICLES[(10 + 3 * u) % len(ARTICLES)][0]
        users.append({"id": spec["user_id"], "user_id": spec["user_id"],
                      "input": "Generate a headline for the following article: " + target["text"],
                      "output": target["title"], "profile": items[:10]})
        extra.append(_extras(spec, topic, [
            f"Officials announce {topic} changes", f"New {topic} decision this week",
            f"{topic.title()} update for residents", f"What the {topic} vote means",
            f"Region reacts to {topic} news",
        ]))
    return users, extra


def _reddit() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    users, extra = [], []
    for u, spec in enumerate(REDDIT_USERS):
        items = []
        for i in range(11):
            topic, key = TOPICS[(i + 2 * u) % len(TOPICS)]
            items.append({"summary": f"The author shares their experience {topic}.",
                          "content": spec["post"](topic, key)})
        target = items[10]
        topic, key = TOPICS[(10 + 2 * u) % len(TOPICS)]
        users.append({"author": spec["user_id"],
                      "input": "Generate the content for a reddit post " + target["summary"],
                      "output": target["content"], "profile": items[:10]})
        extra.append(_extras(spec, key, [
            f"I tried {topic} and it went fine. Here is what happened.",
            f"Some thoughts on {topic}. It takes time but it is possible.",
            f"My story about {topic}. It was a learning experience for me.",
            f"Long post about {topic}. Overall I am glad I did it.",
            f"Sharing my {key} journey. Good luck to everyone trying it.",
        ]))
    return users, extra


def _extras(spec: dict[str, Any], answer: str, outputs: list[str]) -> dict[str, Any]:
    return {"user_id": spec["user_id"], "answer": answer, "preference": spec["preference"],
            "rules": spec["rules"], "baselines": dict(zip(METHODS, outputs, strict=True))}


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def main() -> None:
    amazon, ea = _amazon()
    news, en = _news()
    reddit, er = _reddit()
    _write_jsonl(HERE / "amazon.jsonl", amazon)
    _write_jsonl(HERE / "lamp4.jsonl", news)
    _write_jsonl(HERE / "longlamp.jsonl", reddit)
    extras = ea + en + er
    _write_jsonl(HERE / "baselines.jsonl", [
        {"user_id": e["user_id"], "method": m, "output": o}
        for e in extras for m, o in e["baselines"].items()])
    _write_jsonl(HERE / "rules.jsonl", [{"user_id": e["user_id"], "rules": e["rules"]}
                                        for e in extras])
    _write_jsonl(HERE / "constraints.jsonl", [
        {"user_id": e["user_id"], "answer": e["answer"], "preference": e["preference"]}
        for e in extras])


if __name__ == "__main__":
    main()
