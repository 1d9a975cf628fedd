"""Compositionality benchmarks as published: SugarCrepe, ARO (VG-Relation, VG-Attribution,
COCO-Order, Flickr30k-Order), with their accuracy rules.

Tie rule everywhere: an item is correct only if the true caption's score is strictly
greater than every competing caption's score (a tie is an error).

Items are dicts with ``image_path`` (and ``bbox`` for ARO's VG sets); open images with
``mdc.data.formats.load_image``. Missing fields raise ValueError naming file, item and field;
missing images raise too, or with ``on_missing="skip"`` drop the item (see
:class:`mdc.data.formats.Items`: ``total`` and ``missing`` say how many were evaluated).
"""
from __future__ import annotations

import functools
import os
import re
import warnings
from typing import Mapping, Sequence

import numpy as np

from mdc.data.formats import ImageLookup, Items, read_json, require

# ------------------------------------------------------------------------------ SugarCrepe
SUGARCREPE_SUBSETS = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
SUGARCREPE_COLUMNS = {"add": ("add_att", "add_obj"),
                      "replace": ("replace_att", "replace_obj", "replace_rel"),
                      "swap": ("swap_att", "swap_obj")}


def load_sugarcrepe(root_json_dir: str, image_dir: str, subsets: Sequence[str] = SUGARCREPE_SUBSETS,
                    on_missing: str = "error") -> dict[str, Items]:
    """``{subset: [{id, image_path, caption, negative_caption}]}`` from ``<subset>.json`` files,
    each ``{"<idx>": {"filename", "caption", "negative_caption"}}``; images are COCO val2017."""
    out = {}
    for subset in subsets:
        path = os.path.join(root_json_dir, f"{subset}.json")
        data = read_json(path, root=dict)
        lookup = ImageLookup(image_dir, path, on_missing)
        items = []
        for key, record in data.items():
            require(record, ["filename", "caption", "negative_caption"], path, key)
            image = lookup(record["filename"], key)
            if image is not None:
                items.append({"id": key, "image_path": image, "caption": record["caption"],
                              "negative_caption": record["negative_caption"]})
        out[subset] = lookup.items(items, len(data))
    return out


def sugarcrepe_columns(correct: Mapping[str, Sequence[bool]]) -> dict[str, float]:
    """Paper columns from per-item correctness (``{subset: [bool per item]}``).

    add = {add_att, add_obj}, replace = {replace_att, replace_obj, replace_rel},
    swap = {swap_att, swap_obj}; each column is the ITEM-weighted mean over its sub-files
    (all their items pooled), not the mean of sub-file accuracies. Per-subset accuracies
    are returned too. Columns whose sub-files are all absent are left out.
    """
    out = {subset: float(np.mean(flags)) for subset, flags in correct.items() if len(flags)}
    for column, subsets in SUGARCREPE_COLUMNS.items():
        pooled = [flag for s in subsets for flag in correct.get(s, ())]
        if pooled:
            out[column] = float(np.mean(pooled))
    return out


# ------------------------------------------------------------------------------ ARO: VG
# The relations ARO's published evaluation (the VG-Relation notebook of
# mertyg/vision-language-models-are-bows) drops before macro-averaging VG-Relation:
# relations whose swapped caption is not necessarily false.
ARO_SYMMETRIC_RELATIONS = frozenset([
    "adjusting", "attached to", "between", "bigger than", "biting", "boarding", "brushing", "chewing",
    "cleaning", "climbing", "close to", "coming from", "coming out of", "contain", "crossing", "dragging",
    "draped over", "drinking", "drinking from", "driving", "driving down", "driving on", "eating from",
    "eating in", "enclosing", "exiting", "facing", "filled with", "floating in", "floating on", "flying",
    "flying above", "flying in", "flying over", "flying through", "full of", "going down", "going into",
    "going through", "grazing in", "growing in", "growing on", "guiding", "hanging from", "hanging in",
    "hanging off", "hanging over", "higher than", "holding onto", "hugging", "in between", "jumping off",
    "jumping on", "jumping over", "kept in", "larger than", "leading", "leaning over", "leaving", "licking",
    "longer than", "looking in", "looking into", "looking out", "looking over", "looking through",
    "lying next to", "lying on top of", "making", "mixed with", "mounted on", "moving", "on the back of",
    "on the edge of", "on the front of", "on the other side of", "opening", "painted on", "parked at",
    "parked beside", "parked by", "parked in", "parked in front of", "parked near", "parked next to",
    "perched on", "petting", "piled on", "playing", "playing in", "playing on", "playing with", "pouring",
    "reaching for", "reading", "reflected on", "riding on", "running in", "running on", "running through",
    "seen through", "sitting behind", "sitting beside", "sitting by", "sitting in front of", "sitting near",
    "sitting next to", "sitting under", "skiing down", "skiing on", "sleeping in", "sleeping on",
    "smiling at", "sniffing", "splashing", "sprinkled on", "stacked on", "standing against",
    "standing around", "standing behind", "standing beside", "standing in front of", "standing near",
    "standing next to", "staring at", "stuck in", "surrounding", "swimming in", "swinging", "talking to",
    "topped with", "touching", "traveling down", "traveling on", "tying", "typing on", "underneath",
    "wading in", "waiting for", "walking across", "walking by", "walking down", "walking next to",
    "walking through", "working in", "working on", "worn on", "wrapped around", "wrapped in",
    "by", "of", "near", "next to", "with", "beside", "on the side of", "around",
])
VG_FIELDS = ("image_path", "bbox_x", "bbox_y", "bbox_w", "bbox_h", "true_caption", "false_caption")


def _load_vg(json_path: str, image_dir: str, label_field: str, on_missing: str) -> Items:
    data = read_json(json_path, root=list)
    lookup = ImageLookup(image_dir, json_path, on_missing)
    items = []
    for index, record in enumerate(data):
        require(record, (*VG_FIELDS, label_field), json_path, index)
        image = lookup(record["image_path"], index)
        if image is not None:
            items.append({"id": index, "image_path": image, "bbox": tuple(record[f"bbox_{k}"] for k in "xywh"),
                          "true_caption": record["true_caption"], "false_caption": record["false_caption"],
                          label_field: record[label_field]})
    return lookup.items(items, len(data))


def load_vg_relation(json_path: str, image_dir: str, on_missing: str = "error") -> Items:
    """``visual_genome_relation.json`` -> ``[{id, image_path, bbox, true_caption, false_caption,
    relation_name}]``; ``load_image(item)`` crops to ``bbox`` = (x, y, w, h)."""
    return _load_vg(json_path, image_dir, "relation_name", on_missing)


def load_vg_attribution(json_path: str, image_dir: str, on_missing: str = "error") -> Items:
    """``visual_genome_attribution.json`` -> ``[{id, image_path, bbox, true_caption,
    false_caption, attributes}]`` (``attributes``: the two swapped attributes)."""
    return _load_vg(json_path, image_dir, "attributes", on_missing)


def pairwise_correct(true_scores, false_scores) -> np.ndarray:
    """Per item: score(true caption) > score(false caption), strictly (ties are errors)."""
    return np.asarray(true_scores, dtype=np.float64) > np.asarray(false_scores, dtype=np.float64)


def _macro(groups: Sequence, correct: Sequence[bool], min_count: int) -> tuple[float, dict]:
    correct = np.asarray(correct, dtype=bool)
    if len(groups) != len(correct):
        raise ValueError(f"{len(groups)} items but {len(correct)} correctness flags")
    per_group = {}
    for g in sorted(set(groups)):
        mask = np.array([x == g for x in groups])
        if mask.sum() >= min_count:
            per_group[g] = float(correct[mask].mean())
    return (float(np.mean(list(per_group.values()))) if per_group else float("nan")), per_group


def vg_relation_accuracy(items: Sequence[dict], correct: Sequence[bool]) -> tuple[float, dict[str, float]]:
    """ARO's VG-Relation number: mean over relations of per-relation accuracy, relations in
    ``ARO_SYMMETRIC_RELATIONS`` excluded. Returns (macro accuracy, {relation: accuracy})."""
    keep = [i for i, item in enumerate(items) if item["relation_name"] not in ARO_SYMMETRIC_RELATIONS]
    flags = np.asarray(correct, dtype=bool)
    if len(items) != len(flags):
        raise ValueError(f"{len(items)} items but {len(flags)} correctness flags")
    return _macro([items[i]["relation_name"] for i in keep], flags[keep], min_count=1)


def vg_attribution_accuracy(items: Sequence[dict], correct: Sequence[bool],
                            min_count: int = 25) -> tuple[float, dict[str, float]]:
    """ARO's VG-Attribution number: mean over attribute pairs (``"a_b"`` from ``attributes``)
    of per-pair accuracy, pairs with fewer than ``min_count`` items dropped (ARO uses 25).
    Returns (macro accuracy, {pair: accuracy})."""
    return _macro([f"{item['attributes'][0]}_{item['attributes'][1]}" for item in items], correct, min_count)


# ------------------------------------------------------------------------------ ARO: Order
# ARO's TextShuffler tags with spaCy's en_core_web_sm: nouns are the fine-grained tags NN,
# NNS, NNP, NNPS and adjectives JJ, JJR, JJS (``token.tag_``). Without spaCy a built-in
# tagger approximates it (word lists, suffixes and the neighbouring words).
PERTURBATIONS = ("shuffle_nouns_and_adj", "shuffle_allbut_nouns_and_adj", "shuffle_within_trigrams",
                 "shuffle_trigrams")

SPACY_MODEL = "en_core_web_sm"
SPACY_NOUN_TAGS, SPACY_ADJ_TAGS = ("NN", "NNS", "NNP", "NNPS"), ("JJ", "JJR", "JJS")
TAGGERS = ("auto", "spacy", "builtin")


def _w(text: str) -> frozenset:
    return frozenset(text.split())


_DETERMINERS = _w("""a an the this that these those some any each every no another its their his her our your
my whose which what zero one two three four five six seven eight nine ten eleven twelve dozen hundred both all""")
_PREPOSITIONS = _w("""in on at of to from by with without into onto upon over under above below near beside
besides between behind before after across along around through toward towards against among inside outside
within off out up down about like via next atop beneath underneath amid during for past throughout""")
_OTHER = _w("""and or but nor so yet if than as because though although then also not very too just only still
even ever never again once almost nearly quite really rather together away apart nearby sideways ahead upside
close now well there here where when while how why who whom i me you he him she it we us they them himself herself
itself themselves someone something somebody everyone everything anything nothing ones is are was were be been
being am has have had having do does did could will would may might must shall should""")
_COPULAS = _w("is are was were be been being looks look seems seem appears appear")
_VERBS = _w("""sit lean lie lay eat hold carry perch graze hang sleep wait wear chew hug grab pull push fill climb
sniff lick stare gaze peer peek tilt kneel crouch squat stretch prepare decorate include contain depict overlook
float steer swim travel gather huddle wander roam approach enter reach appear seem sell buy feed fix wash read write
talk speak laugh yawn chase follow pose go get take give make become use try cross carry bake chop stir pour
toss perform socialize interact ride drive fly""")  # verbs whose forms are not (frequent) nouns
_PARTICIPLES = _w("""made built taken seen driven shown worn drawn hung thrown grown known done eaten given gone
written ridden hidden stuck caught bought brought sold told found kept fed sent spent bent knelt slept bitten chosen
flown sewn shaken stolen torn woven beaten begun sung sunk laid paid said sat stood ate rode drove threw flew grew
drew wore took gave came went saw began held led met swam swung spun struck dug won fallen frozen broken""")
_NOUN_VERBS = _w("""stand walk play park show look rest drink swing kick throw catch cut set wave surf skate dance
run cook paint shop display smoke pitch hit shot split left spread put fit lit cover frame trick jump turn stop
watch pet roll guide herd slide sail lift smile bark race shake brush bite sip grill slice serve feature lead pass
cross""")  # noun/verb homographs: context decides
_PAST_NOUN_VERBS = _w("cut set put hit split spread shot left lit fit")  # participles that are nouns too
_ED_ADJECTIVES = _w("cluttered crowded bearded frosted deserted dotted")  # -ed words spaCy tags JJ before a noun
_INGS = _w("""building ceiling clothing painting thing string evening morning wedding awning bedding icing frosting
topping railing siding pudding dumpling sibling seedling duckling sling earring stuffing ring king wing spring""")
_ADJECTIVES = _w("""white black red blue green yellow orange purple pink brown gray grey silver golden gold dark light
bright tan beige small large big little huge tiny tall short long wide narrow high low old young new empty full open
closed wooden plastic hot cold wet dry clean dirty busy pretty beautiful cute other same different several various
many few multiple single double round flat colorful striped plain fresh ripe male female older younger
smiling happy giant lone lush nice sweet damp fast hard soft ready alone medium outdoor indoor modern ancient antique
vintage simple calm wild dead alive quiet loud thick thin fat deep shallow steep sharp smooth rough warm cool raw
enormous massive upright bare blank real fake fine good great bad best favorite main whole extra larger largest
smaller smallest bigger biggest taller tallest oldest youngest polar public electric concrete separate miniature
sunny grassy cloudy snowy rocky sandy muddy dusty messy fluffy shiny foggy rainy windy stormy leafy shady sleepy
hairy juicy icy chubby silly shaggy cozy fancy heavy ugly curly wavy tasty crispy creamy cheesy spicy salty rusty
furry fuzzy hilly bumpy soggy skinny funny healthy crazy lazy sticky steamy smoky misty frosty chilly sweaty hungry
angry scary bushy woody watery sugary lengthy grimy greasy slimy slippery speedy sturdy tidy trendy hazy murky
shabby spiky spotty thorny wiry gloomy noisy lonely lovely friendly early elderly jolly woolly cuddly smelly bubbly
prickly wrinkly sparkly lively costly solid modern western eastern northern southern""")
_COLOURS = _w("white black red blue green yellow orange purple pink brown gray grey silver gold tan beige light")
_NOUNS = _w("""family lily belly jelly rally assembly supply reply bully holly dolly gully speed hundred seaweed breed
steed bobsled animal signal hospital terminal festival sandal cereal capital pedestal carnival cathedral tutorial
material mineral funeral traffic music picnic clinic attic mosaic fabric graphic topic logic magic cheese geese
locomotive detective""")  # nouns a suffix rule would call something else
_ADJ_SUFFIXES = ("ful", "ous", "ive", "less", "ish", "able", "ible", "ical", "ial", "ual", "ic", "ese")


def _s_stems(word: str) -> tuple[str, ...]:
    """Possible base forms of an -s form: carries -> carry, poses -> pose/pos, washes -> wash."""
    if word.endswith("ies"):
        return word[:-3] + "y", word[:-1]
    if word.endswith("es"):
        return word[:-2], word[:-1]
    return (word[:-1],) if word.endswith("s") and not word.endswith("ss") else ()


def _lexical(word: str) -> str:
    """A word's class out of context: det, prep, other, verb, nv (noun/verb), ing, ed, adj or noun."""
    word = word.split("'")[0] or word  # man's -> man, it's -> it
    for cls, vocab in (("det", _DETERMINERS), ("prep", _PREPOSITIONS), ("other", _OTHER), ("adj", _ADJECTIVES),
                       ("noun", _NOUNS), ("noun", _INGS), ("nv", _NOUN_VERBS), ("verb", _VERBS), ("ed", _PARTICIPLES)):
        if word in vocab:
            return cls
    stems = _s_stems(word)
    if any(s in _NOUN_VERBS for s in stems):
        return "nv"
    if word.isdigit():
        return "det"
    if any(s in _VERBS for s in stems):
        return "verb"
    if len(word) > 4 and word.endswith(("ing", "ed")):
        return "ing" if word.endswith("ing") else "ed"
    if len(word) > 4 and word.endswith("ly"):
        return "noun" if word.endswith("fly") else "other"  # butterfly; else adverbs
    if (len(word) > 5 and word.endswith(_ADJ_SUFFIXES)) or (len(word) > 6 and word.endswith("al")):
        return "adj"
    return "noun"


def _nv_is_noun(words: Sequence[str], lex: Sequence[str], i: int) -> bool:
    """Is the noun/verb homograph ``words[i]`` a noun here? (see :func:`builtin_word_classes`)"""
    prev = lex[i - 1] if i else "start"
    if prev == "start" or (prev in ("det", "adj", "prep") and words[i - 1] != "to"):
        return True  # "a stand", "on display"; but "to throw"
    if prev in ("verb", "ing", "ed"):
        return True  # the object: "doing tricks"
    if prev in ("noun", "nv") and not words[i].endswith("s") and words[i] not in _PAST_NOUN_VERBS:
        return not words[i - 1].endswith("s")  # a compound ("a bus stop") unless after a plural ("kids play")
    return False


def _after_copula(words: Sequence[str], lex: Sequence[str], i: int) -> bool:
    """Is ``words[i]`` predicative: a copula before it with only adjectives and "and" between ("is red and white")?"""
    j = i - 1
    while j >= 0 and (lex[j] == "adj" or words[j] in ("and", "or", "very")):
        j -= 1
    return j >= 0 and words[j] in _COPULAS


def builtin_word_classes(words: Sequence[str]) -> list[str]:
    """'noun' | 'adj' | 'other' per word, approximating spaCy's tags without a model.

    Word lists give determiners and numbers, prepositions, other closed-class words, verbs
    and irregular participles, adjectives (colours, sizes, materials, frequent -y and -ly
    ones) and nouns that look like something else (family, building, hospital); suffixes
    give adjectives (-ful -ous -ive -less -ish -able -ible -ical -ial -ual -ic -ese -al),
    adverbs (-ly) and participles (-ing, -ed). The neighbours decide ambiguous words: an
    -ing word is a noun after a determiner or adjective ("a parking lot"), else a verb; an
    -ed word or participle is an adjective there ("a cluttered desk"), else a verb; a
    noun/verb homograph ("stand", "waves", "set") is a noun at the start or after a
    determiner, adjective or preposition other than "to", else a verb; a colour is a noun
    before a preposition or the end unless it follows a copula ("dressed in white", "a
    traffic light on a pole", but "is red and white"); an unlisted -s word between a noun and a
    determiner is a verb ("a man grabs a"); every other word keeps its class.
    """
    lex = [_lexical(w) for w in words]
    out: list[str] = []
    for i, (word, cls) in enumerate(zip(words, lex)):
        prev = lex[i - 1] if i else "start"
        nxt = lex[i + 1] if i + 1 < len(lex) else "end"
        after_modifier = prev in ("det", "adj") or (i > 0 and out[-1] == "adj")
        if cls == "ing":
            cls = "noun" if after_modifier else "other"
        elif cls == "ed":
            cls = "adj" if "-" in word or (after_modifier and word in _ED_ADJECTIVES) else "other"
        elif cls == "nv":
            cls = "noun" if _nv_is_noun(words, lex, i) else "other"
        elif cls == "adj" and word in _COLOURS and prev != "start" and nxt in ("prep", "end"):
            cls = "adj" if _after_copula(words, lex, i) else "noun"
        elif cls == "noun" and word.endswith("s") and prev in ("noun", "nv") and nxt == "det":
            cls = "other"
        out.append(cls if cls in ("noun", "adj") else "other")
    return out


@functools.lru_cache(maxsize=None)
def _spacy_nlp():
    """spaCy's ``en_core_web_sm`` pipeline, or None when spaCy or the model is not installed."""
    try:
        import spacy

        return spacy.load(SPACY_MODEL)
    except (ImportError, OSError):
        return None


def resolve_tagger(tagger: str = "auto") -> str:
    """"spacy" or "builtin": what ``tagger`` ("auto" | "spacy" | "builtin") means on this machine."""
    if tagger not in TAGGERS:
        raise ValueError(f"tagger must be one of {TAGGERS}; got {tagger!r}")
    if tagger == "builtin":
        return "builtin"
    if _spacy_nlp() is not None:
        return "spacy"
    if tagger == "spacy":
        raise ValueError(f"tagger='spacy' needs spaCy and its {SPACY_MODEL} model: "
                         f"pip install spacy && python -m spacy download {SPACY_MODEL}")
    return "builtin"


def word_classes(words: Sequence[str], tagger: str = "auto") -> list[str]:
    """'noun' | 'adj' | 'other' per word, as ARO's TextShuffler decides them.

    With spaCy (``tagger="spacy"``, or "auto" when ``spacy`` and ``en_core_web_sm`` import):
    each word's fine-grained tag, tagging the words as given (one token each) so that the
    perturbations stay permutations of the normalised words; ARO tags spaCy's own tokens,
    which differ only for the few words spaCy splits (apostrophes, some hyphens). Without:
    :func:`builtin_word_classes`.
    """
    if resolve_tagger(tagger) == "builtin":
        return builtin_word_classes(words)
    from spacy.tokens import Doc

    nlp = _spacy_nlp()
    doc = nlp(Doc(nlp.vocab, words=list(words)))
    return ["noun" if t.tag_ in SPACY_NOUN_TAGS else "adj" if t.tag_ in SPACY_ADJ_TAGS else "other" for t in doc]


def normalise_caption(caption: str, max_words: int = 30) -> list[str]:
    """Lowercase, punctuation to spaces (apostrophes and hyphens kept), first ``max_words`` words."""
    return re.sub(r"[^a-z0-9'\- ]+", " ", caption.lower()).split()[:max_words]


def _trigrams(words: list[str]) -> list[list[str]]:
    return [words[i:i + 3] for i in range(0, len(words), 3)]


def perturb_caption(words: Sequence[str], rng: np.random.Generator,
                    classes: Sequence[str] | None = None) -> list[list[str]]:
    """ARO's four order perturbations of a word list, in ``PERTURBATIONS`` order; each is a
    permutation of ``words``: nouns shuffled among nouns and adjectives among adjectives;
    all other words shuffled among themselves; words shuffled inside each consecutive
    trigram; the trigrams' order shuffled. ``classes``: 'noun' | 'adj' | 'other' per word
    (default: :func:`word_classes` with ``tagger="auto"``)."""
    words = list(words)
    classes = word_classes(words) if classes is None else list(classes)
    if len(classes) != len(words):
        raise ValueError(f"got {len(classes)} word classes for {len(words)} words")
    out = []
    shuffled = list(words)
    for cls in ("noun", "adj"):
        idx = [i for i, c in enumerate(classes) if c == cls]
        for i, j in zip(idx, rng.permutation(idx)):
            shuffled[i] = words[j]
    out.append(shuffled)
    shuffled = list(words)
    idx = [i for i, c in enumerate(classes) if c == "other"]
    for i, j in zip(idx, rng.permutation(idx)):
        shuffled[i] = words[j]
    out.append(shuffled)
    out.append([w for tri in _trigrams(words) for w in rng.permutation(tri).tolist()])
    trigrams = _trigrams(words)
    out.append([w for k in rng.permutation(len(trigrams)) for w in trigrams[k]])
    return out


def load_order_suite(karpathy_test_json: str, image_dir: str | None, seed: int = 0, max_words: int = 30,
                     on_missing: str = "error", tagger: str = "auto") -> Items:
    """COCO-Order / Flickr30k-Order from ARO's Karpathy test file (``[{image, caption: [5]}]``).

    One item per caption: ``{id, image_path, caption, perturbed: [4 captions], identical:
    [4 bools]}``. Captions are normalised (:func:`normalise_caption`, ARO also truncates to
    30 words); the perturbations (:func:`perturb_caption`) permute the normalised words, so
    each is a permutation of the true caption. Randomness is seeded per caption from
    (seed, image index, caption index): the suite does not depend on iteration order.

    Nouns and adjectives come from :func:`word_classes` (``tagger``): spaCy's
    ``en_core_web_sm`` tags, as ARO, when installed (``pip install spacy && python -m spacy
    download en_core_web_sm``; "auto" uses it when it imports), else the built-in tagger
    (:func:`builtin_word_classes`; "auto" warns), which agrees with spaCy on most but not all
    words, so the first two perturbations then differ somewhat from ARO's. The returned
    :class:`Items` has ``tagger`` ("spacy" or "builtin").
    ``identical[k]`` flags a perturbation equal to the true caption (short captions).
    ``image_dir=None`` builds the captions without looking for images (``image_path`` None);
    ``total`` counts captions, and a missing image (``on_missing="skip"``) drops all of its captions.
    """
    used = resolve_tagger(tagger)
    if used == "builtin" and tagger == "auto":
        warnings.warn(f"{karpathy_test_json}: spaCy's {SPACY_MODEL} is not installed; tagging nouns and "
                      f"adjectives with the built-in tagger, an approximation of ARO's (pip install spacy && "
                      f"python -m spacy download {SPACY_MODEL} for ARO's exact perturbations)", stacklevel=2)
    data = read_json(karpathy_test_json, root=list)
    lookup = ImageLookup(image_dir or "", karpathy_test_json, on_missing)
    items, total = [], 0
    for index, record in enumerate(data):
        require(record, ["image", "caption"], karpathy_test_json, index)
        captions = [record["caption"]] if isinstance(record["caption"], str) else record["caption"]
        total += len(captions)
        path = lookup(record["image"], index) if image_dir is not None else None
        if path is None and image_dir is not None:
            continue
        for c, caption in enumerate(captions):
            words = normalise_caption(caption, max_words)
            rng = np.random.default_rng((seed, index, c))
            perturbed = [" ".join(p) for p in perturb_caption(words, rng, word_classes(words, used))]
            true = " ".join(words)
            items.append({"id": f"{index}.{c}", "image_path": path, "caption": true, "perturbed": perturbed,
                          "identical": [p == true for p in perturbed]})
    out = lookup.items(items, total)
    out.tagger = used
    return out


def order_accuracy(items: Sequence[dict], true_scores, perturbed_scores) -> float:
    """Fraction of captions whose true caption scores strictly above each of its
    perturbations (``perturbed_scores``: [N, 4]). A perturbation that is the very same
    string as the true caption (``identical``) is the same caption, not a competitor, and
    is ignored; any other tie counts as an error."""
    true = np.asarray(true_scores, dtype=np.float64)[:, None]
    perturbed = np.asarray(perturbed_scores, dtype=np.float64)
    if perturbed.shape != (len(items), len(PERTURBATIONS)) or len(true) != len(items):
        raise ValueError(f"expected {len(items)} true scores and [{len(items)}, 4] perturbed scores, "
                         f"got {len(true)} and {list(perturbed.shape)}")
    identical = np.array([item["identical"] for item in items], dtype=bool)
    return float(((true > perturbed) | identical).all(axis=1).mean())
