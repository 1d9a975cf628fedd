"""Nouns, adjectives and the rest: the word classes ARO's order perturbations shuffle.

ARO's TextShuffler tags with spaCy's en_core_web_sm: nouns are the fine-grained tags NN, NNS,
NNP, NNPS and adjectives JJ, JJR, JJS (``token.tag_``). :func:`word_classes` does the same when
spaCy and the model are installed (``pip install spacy && python -m spacy download
en_core_web_sm``); otherwise :func:`builtin_word_classes` approximates it from word lists,
suffixes and the neighbouring words, with no model download.

ARO tags the raw caption (case and punctuation kept) and shuffles spaCy's own tokens; its trigram
shuffles use ``nltk.word_tokenize``'s. :func:`tag_caption` gives those tokens and their classes
(spaCy's, or :func:`split_caption` and the built-in tagger), :func:`split_caption` either tokenisation.
"""
from __future__ import annotations

import functools
import re
from typing import Sequence

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
being am has have had having do does did could will would may might must shall should ca wo""")  # ca / wo n't
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


_OPENING = "\"'“‘([{<"
_CLOSING = ".,!?;:)]}>\"'”’…"
_CLITICS = ("n't", "n’t", "'s", "’s", "'re", "’re", "'ve", "’ve", "'ll", "’ll", "'d", "’d", "'m", "’m")
_INFIX = re.compile(r"(?<=[^\W_])(-+|/)(?=[^\W\d_])")  # a hyphen or slash between a letter/digit and a letter


def _is_clitic(token: str) -> bool:
    return token.lower() in _CLITICS


def split_caption(caption: str, hyphens: bool = True) -> list[str]:
    """The tokens of a raw caption, case and punctuation kept: whitespace-separated chunks, opening
    punctuation split off the front, closing punctuation and clitics ('s, n't, 're, ...) off the end,
    a chunk of punctuation alone ("...") or an abbreviation ("a.m.") left whole. ``hyphens``: split a
    hyphen or slash between letters into a token of its own ("t - shirt"), as spaCy's English
    tokenizer does; False keeps "t-shirt" whole, as ``nltk.word_tokenize`` does (ARO's trigram shuffles)."""
    out: list[str] = []
    for chunk in caption.split():
        if not any(ch.isalnum() for ch in chunk) or re.fullmatch(r"(?:[^\W\d_]\.){2,}", chunk):
            out.append(chunk)
            continue
        head, tail = [], []
        while len(chunk) > 1 and chunk[0] in _OPENING:
            head.append(chunk[0])
            chunk = chunk[1:]
        while len(chunk) > 1:
            clitic = next((c for c in _CLITICS if chunk.lower().endswith(c) and len(chunk) > len(c)), None)
            if clitic is None and chunk[-1] not in _CLOSING:
                break
            cut = len(clitic) if clitic else 1
            tail.append(chunk[-cut:])
            chunk = chunk[:-cut]
        middle = _INFIX.split(chunk) if hyphens else [chunk]
        out += head + [m for m in middle if m] + tail[::-1]
    return out


def token_classes(tokens: Sequence[str]) -> list[str]:
    """'noun' | 'adj' | 'other' per token of :func:`split_caption`: the words (lowercased) by
    :func:`builtin_word_classes`; punctuation, clitics and numbers are 'other', as spaCy's tags make them."""
    words = [i for i, t in enumerate(tokens) if any(ch.isalpha() for ch in t) and not _is_clitic(t)]
    out = ["other"] * len(tokens)
    for i, cls in zip(words, builtin_word_classes([tokens[i].lower() for i in words])):
        out[i] = cls
    return out


def tag_caption(caption: str, tagger: str = "auto") -> tuple[list[str], list[str]]:
    """ARO's tokens of a raw caption and their classes ('noun' | 'adj' | 'other'): spaCy's own tokens
    and tags (``tagger`` "spacy", or "auto" when spaCy imports), else :func:`split_caption` (spaCy's
    way with hyphens) and :func:`token_classes`."""
    if resolve_tagger(tagger) == "builtin":
        tokens = split_caption(caption)
        return tokens, token_classes(tokens)
    doc = _spacy_nlp()(caption)
    return [t.text for t in doc], [_spacy_class(t.tag_) for t in doc]


def _spacy_class(tag: str) -> str:
    return "noun" if tag in SPACY_NOUN_TAGS else "adj" if tag in SPACY_ADJ_TAGS else "other"


def word_classes(words: Sequence[str], tagger: str = "auto") -> list[str]:
    """'noun' | 'adj' | 'other' per word, as ARO's TextShuffler decides them.

    With spaCy (``tagger="spacy"``, or "auto" when ``spacy`` and ``en_core_web_sm`` import):
    each word's fine-grained tag, tagging the words as given (one token each), for
    :func:`mdc.data.aro_sugarcrepe.perturb_caption` of a word list. The order suites tag the raw caption
    with :func:`tag_caption` instead, spaCy's own tokens as ARO. Without: :func:`builtin_word_classes`.
    """
    if resolve_tagger(tagger) == "builtin":
        return builtin_word_classes(words)
    from spacy.tokens import Doc

    nlp = _spacy_nlp()
    doc = nlp(Doc(nlp.vocab, words=list(words)))
    return [_spacy_class(t.tag_) for t in doc]
