"""Generate examples/data/geography.txt, the small corpus the demo fine-tunes on.

No text corpus can be downloaded here, so this one is generated: plain English sentences about countries,
their capitals, continents, languages and currencies, from templates. It is dedicated to the public domain
(CC0). Deterministic: rerunning writes the same file.

    python scripts/make_corpus.py [examples/data/geography.txt]
"""

import os
import random
import sys

# country: (capital, continent, language, currency)
FACTS = {
    "France": ("Paris", "Europe", "French", "euro"),
    "Germany": ("Berlin", "Europe", "German", "euro"),
    "Italy": ("Rome", "Europe", "Italian", "euro"),
    "Spain": ("Madrid", "Europe", "Spanish", "euro"),
    "Portugal": ("Lisbon", "Europe", "Portuguese", "euro"),
    "Austria": ("Vienna", "Europe", "German", "euro"),
    "Greece": ("Athens", "Europe", "Greek", "euro"),
    "Ireland": ("Dublin", "Europe", "English", "euro"),
    "Finland": ("Helsinki", "Europe", "Finnish", "euro"),
    "Netherlands": ("Amsterdam", "Europe", "Dutch", "euro"),
    "Belgium": ("Brussels", "Europe", "Dutch", "euro"),
    "Poland": ("Warsaw", "Europe", "Polish", "zloty"),
    "Sweden": ("Stockholm", "Europe", "Swedish", "krona"),
    "Norway": ("Oslo", "Europe", "Norwegian", "krone"),
    "Denmark": ("Copenhagen", "Europe", "Danish", "krone"),
    "Hungary": ("Budapest", "Europe", "Hungarian", "forint"),
    "Russia": ("Moscow", "Europe", "Russian", "ruble"),
    "Ukraine": ("Kyiv", "Europe", "Ukrainian", "hryvnia"),
    "Switzerland": ("Bern", "Europe", "German", "franc"),
    "Czechia": ("Prague", "Europe", "Czech", "koruna"),
    "Japan": ("Tokyo", "Asia", "Japanese", "yen"),
    "China": ("Beijing", "Asia", "Chinese", "yuan"),
    "India": ("Delhi", "Asia", "Hindi", "rupee"),
    "Thailand": ("Bangkok", "Asia", "Thai", "baht"),
    "Vietnam": ("Hanoi", "Asia", "Vietnamese", "dong"),
    "Indonesia": ("Jakarta", "Asia", "Indonesian", "rupiah"),
    "Korea": ("Seoul", "Asia", "Korean", "won"),
    "Turkey": ("Ankara", "Asia", "Turkish", "lira"),
    "Iran": ("Tehran", "Asia", "Persian", "rial"),
    "Pakistan": ("Islamabad", "Asia", "Urdu", "rupee"),
    "Egypt": ("Cairo", "Africa", "Arabic", "pound"),
    "Kenya": ("Nairobi", "Africa", "Swahili", "shilling"),
    "Nigeria": ("Abuja", "Africa", "English", "naira"),
    "Morocco": ("Rabat", "Africa", "Arabic", "dirham"),
    "Ghana": ("Accra", "Africa", "English", "cedi"),
    "Ethiopia": ("Addis Ababa", "Africa", "Amharic", "birr"),
    "Senegal": ("Dakar", "Africa", "French", "franc"),
    "Tanzania": ("Dodoma", "Africa", "Swahili", "shilling"),
    "Canada": ("Ottawa", "North America", "English", "dollar"),
    "Mexico": ("Mexico City", "North America", "Spanish", "peso"),
    "Cuba": ("Havana", "North America", "Spanish", "peso"),
    "Brazil": ("Brasilia", "South America", "Portuguese", "real"),
    "Argentina": ("Buenos Aires", "South America", "Spanish", "peso"),
    "Peru": ("Lima", "South America", "Spanish", "sol"),
    "Chile": ("Santiago", "South America", "Spanish", "peso"),
    "Colombia": ("Bogota", "South America", "Spanish", "peso"),
    "Australia": ("Canberra", "Oceania", "English", "dollar"),
    "Fiji": ("Suva", "Oceania", "English", "dollar"),
}

TEMPLATES = [
    "{capital} is the capital of {country}.",
    "The capital of {country} is {capital}.",
    "{capital} is the capital city of {country}.",
    "{country} is a country in {continent}.",
    "{country} lies in {continent}, and its capital is {capital}.",
    "Most people in {country} speak {language}.",
    "The official language of {country} is {language}.",
    "In {country}, people pay with the {currency}.",
    "The currency of {country} is the {currency}.",
    "The government of {country} meets in {capital}.",
    "Travellers to {capital} in {country} often learn a few words of {language}.",
    "Many museums in {capital} tell the history of {country}.",
]


def main(path: str) -> None:
    rng = random.Random(0)
    lines = []
    for _ in range(60):
        for country, (capital, continent, language, currency) in FACTS.items():
            template = rng.choice(TEMPLATES)
            lines.append(
                template.format(
                    country=country, capital=capital, continent=continent, language=language, currency=currency
                )
            )
    rng.shuffle(lines)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}: {len(lines)} lines, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples/data/geography.txt")
