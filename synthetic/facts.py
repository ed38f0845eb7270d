"""Fact tables for the synthetic faithfulness data (`python -m synthetic.synth`).

Written for this project. Two kinds of facts:

* Real-world facts (capitals, currencies, main languages, cities, chemical symbols, authors, moons). Only
  well-settled, unambiguous facts are listed: a country where no single language is clearly the main one has no
  `language` entry, and countries whose capital or currency is disputed or changing (Bolivia, Bulgaria, ...) are
  left out. Counterfactual items change exactly these facts, so they must be right.
* Invented entities (people, companies) that no model can know: multi-hop and some straightforward/inconsistent
  items are about them, so the answer can only come from the context. Their attributes are drawn per split by
  `data.py`; this file only lists the names.

The data generator splits the *entities* (countries with their cities, elements, books, moons, people,
companies) between train and eval, so no eval question is about an entity seen in training.
"""

from __future__ import annotations

# country: (capital, currency, main language or None). Currency names are lowercase common nouns. The language is
# the one most people speak (not the legal status, which many countries leave open); None where that is contested.
# Countries written with "the" (the Netherlands, ...) are left out so a short answer is just the name.
COUNTRIES: dict[str, tuple[str, str, str | None]] = {
    "France": ("Paris", "euro", "French"),
    "Germany": ("Berlin", "euro", "German"),
    "Italy": ("Rome", "euro", "Italian"),
    "Spain": ("Madrid", "euro", "Spanish"),
    "Portugal": ("Lisbon", "euro", "Portuguese"),
    "Greece": ("Athens", "euro", "Greek"),
    "Austria": ("Vienna", "euro", "German"),
    "Ireland": ("Dublin", "euro", "English"),
    "Finland": ("Helsinki", "euro", "Finnish"),
    "Belgium": ("Brussels", "euro", None),
    "Croatia": ("Zagreb", "euro", "Croatian"),
    "Lithuania": ("Vilnius", "euro", "Lithuanian"),
    "Latvia": ("Riga", "euro", "Latvian"),
    "Estonia": ("Tallinn", "euro", "Estonian"),
    "Slovakia": ("Bratislava", "euro", "Slovak"),
    "Slovenia": ("Ljubljana", "euro", "Slovene"),
    "Poland": ("Warsaw", "zloty", "Polish"),
    "Czechia": ("Prague", "koruna", "Czech"),
    "Hungary": ("Budapest", "forint", "Hungarian"),
    "Romania": ("Bucharest", "leu", "Romanian"),
    "Serbia": ("Belgrade", "dinar", "Serbian"),
    "Albania": ("Tirana", "lek", "Albanian"),
    "Sweden": ("Stockholm", "krona", "Swedish"),
    "Norway": ("Oslo", "krone", "Norwegian"),
    "Denmark": ("Copenhagen", "krone", "Danish"),
    "Iceland": ("Reykjavik", "krona", "Icelandic"),
    "Russia": ("Moscow", "ruble", "Russian"),
    "Ukraine": ("Kyiv", "hryvnia", "Ukrainian"),
    "Georgia": ("Tbilisi", "lari", "Georgian"),
    "Armenia": ("Yerevan", "dram", "Armenian"),
    "Turkey": ("Ankara", "lira", "Turkish"),
    "Egypt": ("Cairo", "pound", "Arabic"),
    "Saudi Arabia": ("Riyadh", "riyal", "Arabic"),
    "Qatar": ("Doha", "riyal", "Arabic"),
    "Jordan": ("Amman", "dinar", "Arabic"),
    "Iran": ("Tehran", "rial", "Persian"),
    "Japan": ("Tokyo", "yen", "Japanese"),
    "China": ("Beijing", "yuan", "Mandarin"),
    "South Korea": ("Seoul", "won", "Korean"),
    "Mongolia": ("Ulaanbaatar", "tugrik", "Mongolian"),
    "India": ("New Delhi", "rupee", None),
    "Pakistan": ("Islamabad", "rupee", None),
    "Nepal": ("Kathmandu", "rupee", "Nepali"),
    "Bangladesh": ("Dhaka", "taka", "Bengali"),
    "Thailand": ("Bangkok", "baht", "Thai"),
    "Vietnam": ("Hanoi", "dong", "Vietnamese"),
    "Laos": ("Vientiane", "kip", "Lao"),
    "Cambodia": ("Phnom Penh", "riel", "Khmer"),
    "Malaysia": ("Kuala Lumpur", "ringgit", "Malay"),
    "Australia": ("Canberra", "dollar", "English"),
    "New Zealand": ("Wellington", "dollar", "English"),
    "Canada": ("Ottawa", "dollar", None),
    "Mexico": ("Mexico City", "peso", "Spanish"),
    "Cuba": ("Havana", "peso", "Spanish"),
    "Colombia": ("Bogota", "peso", "Spanish"),
    "Venezuela": ("Caracas", "bolivar", "Spanish"),
    "Brazil": ("Brasilia", "real", "Portuguese"),
    "Argentina": ("Buenos Aires", "peso", "Spanish"),
    "Chile": ("Santiago", "peso", "Spanish"),
    "Peru": ("Lima", "sol", "Spanish"),
    "Kenya": ("Nairobi", "shilling", None),
    "Uganda": ("Kampala", "shilling", None),
    "Nigeria": ("Abuja", "naira", None),
    "Ghana": ("Accra", "cedi", None),
    "Zambia": ("Lusaka", "kwacha", None),
    "Angola": ("Luanda", "kwanza", "Portuguese"),
    "Mozambique": ("Maputo", "metical", None),
    "Morocco": ("Rabat", "dirham", None),
}

# Non-capital cities, by country (capitals come from COUNTRIES). Names that are also cities elsewhere
# (Cordoba, Valencia, Perth, ...) are left out so "X is a city in K" has one true K.
CITIES: dict[str, tuple[str, ...]] = {
    "France": ("Lyon", "Marseille", "Toulouse", "Bordeaux"),
    "Germany": ("Munich", "Hamburg", "Cologne", "Stuttgart"),
    "Italy": ("Milan", "Naples", "Turin", "Florence"),
    "Spain": ("Barcelona", "Seville", "Bilbao"),
    "Portugal": ("Porto", "Coimbra"),
    "Greece": ("Thessaloniki",),
    "Austria": ("Salzburg", "Graz"),
    "Ireland": ("Cork",),
    "Finland": ("Tampere",),
    "Croatia": ("Dubrovnik",),
    "Poland": ("Krakow", "Gdansk", "Wroclaw"),
    "Czechia": ("Brno",),
    "Hungary": ("Debrecen",),
    "Romania": ("Cluj-Napoca",),
    "Serbia": ("Novi Sad",),
    "Sweden": ("Gothenburg", "Malmo"),
    "Norway": ("Bergen",),
    "Denmark": ("Aarhus",),
    "Russia": ("Saint Petersburg", "Novosibirsk", "Kazan"),
    "Ukraine": ("Lviv", "Odesa", "Kharkiv"),
    "Turkey": ("Istanbul", "Izmir"),
    "Egypt": ("Alexandria", "Luxor"),
    "Saudi Arabia": ("Jeddah",),
    "Iran": ("Isfahan", "Shiraz"),
    "Japan": ("Osaka", "Kyoto", "Sapporo", "Nagoya"),
    "China": ("Shanghai", "Guangzhou", "Chengdu", "Shenzhen"),
    "South Korea": ("Busan", "Incheon"),
    "India": ("Mumbai", "Kolkata", "Chennai", "Bangalore"),
    "Pakistan": ("Karachi", "Lahore"),
    "Bangladesh": ("Chittagong",),
    "Thailand": ("Chiang Mai",),
    "Vietnam": ("Ho Chi Minh City",),
    "Australia": ("Sydney", "Melbourne", "Brisbane", "Adelaide"),
    "New Zealand": ("Auckland", "Christchurch"),
    "Canada": ("Toronto", "Vancouver", "Montreal"),
    "Mexico": ("Guadalajara", "Monterrey"),
    "Colombia": ("Medellin", "Cali"),
    "Brazil": ("Sao Paulo", "Rio de Janeiro"),
    "Argentina": ("Rosario", "Mendoza"),
    "Chile": ("Valparaiso",),
    "Peru": ("Cusco", "Arequipa"),
    "Kenya": ("Mombasa",),
    "Nigeria": ("Lagos", "Kano"),
    "Ghana": ("Kumasi",),
    "Morocco": ("Casablanca", "Marrakesh"),
}

# element (lowercase, as written mid-sentence): symbol.
ELEMENTS: dict[str, str] = {
    "hydrogen": "H", "helium": "He", "lithium": "Li", "beryllium": "Be", "boron": "B", "carbon": "C",
    "nitrogen": "N", "oxygen": "O", "fluorine": "F", "neon": "Ne", "sodium": "Na", "magnesium": "Mg",
    "aluminium": "Al", "silicon": "Si", "phosphorus": "P", "sulfur": "S", "chlorine": "Cl", "argon": "Ar",
    "potassium": "K", "calcium": "Ca", "titanium": "Ti", "chromium": "Cr", "manganese": "Mn", "iron": "Fe",
    "cobalt": "Co", "nickel": "Ni", "copper": "Cu", "zinc": "Zn", "gallium": "Ga", "germanium": "Ge",
    "arsenic": "As", "selenium": "Se", "bromine": "Br", "krypton": "Kr", "strontium": "Sr", "zirconium": "Zr",
    "palladium": "Pd", "silver": "Ag", "cadmium": "Cd", "tin": "Sn", "antimony": "Sb", "iodine": "I",
    "xenon": "Xe", "barium": "Ba", "neodymium": "Nd", "tungsten": "W", "platinum": "Pt", "gold": "Au",
    "mercury": "Hg", "lead": "Pb", "bismuth": "Bi", "radon": "Rn", "uranium": "U", "plutonium": "Pu",
}

# book: author.
BOOKS: dict[str, str] = {
    "Pride and Prejudice": "Jane Austen",
    "Emma": "Jane Austen",
    "Nineteen Eighty-Four": "George Orwell",
    "Animal Farm": "George Orwell",
    "Moby-Dick": "Herman Melville",
    "War and Peace": "Leo Tolstoy",
    "Anna Karenina": "Leo Tolstoy",
    "Crime and Punishment": "Fyodor Dostoevsky",
    "The Brothers Karamazov": "Fyodor Dostoevsky",
    "Don Quixote": "Miguel de Cervantes",
    "Hamlet": "William Shakespeare",
    "Macbeth": "William Shakespeare",
    "The Odyssey": "Homer",
    "The Iliad": "Homer",
    "The Divine Comedy": "Dante Alighieri",
    "Great Expectations": "Charles Dickens",
    "Oliver Twist": "Charles Dickens",
    "A Tale of Two Cities": "Charles Dickens",
    "Jane Eyre": "Charlotte Bronte",
    "Wuthering Heights": "Emily Bronte",
    "Frankenstein": "Mary Shelley",
    "Dracula": "Bram Stoker",
    "The Great Gatsby": "F. Scott Fitzgerald",
    "To Kill a Mockingbird": "Harper Lee",
    "The Catcher in the Rye": "J. D. Salinger",
    "Brave New World": "Aldous Huxley",
    "The Old Man and the Sea": "Ernest Hemingway",
    "One Hundred Years of Solitude": "Gabriel Garcia Marquez",
    "The Trial": "Franz Kafka",
    "The Metamorphosis": "Franz Kafka",
    "Ulysses": "James Joyce",
    "Madame Bovary": "Gustave Flaubert",
    "Les Miserables": "Victor Hugo",
    "The Hobbit": "J. R. R. Tolkien",
    "The Lord of the Rings": "J. R. R. Tolkien",
    "Alice's Adventures in Wonderland": "Lewis Carroll",
    "The Adventures of Tom Sawyer": "Mark Twain",
    "Adventures of Huckleberry Finn": "Mark Twain",
    "Little Women": "Louisa May Alcott",
    "The Picture of Dorian Gray": "Oscar Wilde",
    "Beloved": "Toni Morrison",
    "The Grapes of Wrath": "John Steinbeck",
    "Of Mice and Men": "John Steinbeck",
    "Fahrenheit 451": "Ray Bradbury",
    "The Stranger": "Albert Camus",
    "Things Fall Apart": "Chinua Achebe",
    "Mrs Dalloway": "Virginia Woolf",
    "Heart of Darkness": "Joseph Conrad",
    "The Count of Monte Cristo": "Alexandre Dumas",
    "Around the World in Eighty Days": "Jules Verne",
    "The Little Prince": "Antoine de Saint-Exupery",
    "Faust": "Johann Wolfgang von Goethe",
    "The Name of the Rose": "Umberto Eco",
    "Robinson Crusoe": "Daniel Defoe",
    "Gulliver's Travels": "Jonathan Swift",
    "The Time Machine": "H. G. Wells",
    "The War of the Worlds": "H. G. Wells",
    "Treasure Island": "Robert Louis Stevenson",
}

# moon: planet it orbits.
MOONS: dict[str, str] = {
    "Phobos": "Mars", "Deimos": "Mars",
    "Io": "Jupiter", "Europa": "Jupiter", "Ganymede": "Jupiter", "Callisto": "Jupiter", "Amalthea": "Jupiter",
    "Himalia": "Jupiter",
    "Titan": "Saturn", "Enceladus": "Saturn", "Mimas": "Saturn", "Rhea": "Saturn", "Iapetus": "Saturn",
    "Dione": "Saturn", "Tethys": "Saturn", "Hyperion": "Saturn", "Phoebe": "Saturn",
    "Miranda": "Uranus", "Ariel": "Uranus", "Umbriel": "Uranus", "Titania": "Uranus", "Oberon": "Uranus",
    "Puck": "Uranus",
    "Triton": "Neptune", "Nereid": "Neptune", "Proteus": "Neptune", "Larissa": "Neptune",
}
PLANETS: tuple[str, ...] = ("Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune")

# Invented names. A person is FIRST + LAST; the split divides the last names, so train and eval people never
# share a full name (nor a surname).
FIRST_NAMES: tuple[str, ...] = (
    "Alder", "Brisa", "Corvin", "Dalia", "Emeric", "Fenna", "Galen", "Hesper", "Ivo", "Jessamy", "Kellan",
    "Liora", "Marek", "Nerys", "Oren", "Petra", "Quill", "Rosalind", "Soren", "Talia", "Ulric", "Vesna",
    "Wendel", "Xanthe", "Yorick", "Zinnia", "Anselm", "Beatrix", "Cyprian", "Delphine", "Evander", "Flora",
)
LAST_NAMES: tuple[str, ...] = (
    "Ashgrove", "Brackwell", "Carrow", "Dunmere", "Elstow", "Fairhurst", "Garrowby", "Holloway", "Ingleby",
    "Jarrow", "Kettleby", "Lowther", "Marchbank", "Northcott", "Oakenfold", "Pennock", "Quarrie", "Ravensdale",
    "Strathby", "Thornbury", "Underhill", "Varney", "Whitlock", "Yarwood", "Zeller", "Amberley", "Blackmore",
    "Coldridge", "Dovecote", "Eskdale", "Fernhill", "Greystoke", "Hawksley", "Ivesdale", "Kirkland",
    "Larkspur", "Moorcroft", "Netherby", "Pilkington", "Redfern",
)
COMPANIES: tuple[str, ...] = (
    "Brightwater Analytics", "Korvane Systems", "Halden Biotech", "Meridian Freight", "Orchard Lane Foods",
    "Pellucid Optics", "Quarry Peak Mining", "Saltmarsh Energy", "Tidewell Insurance", "Umbra Robotics",
    "Vantor Aerospace", "Wexford Textiles", "Yellowfin Media", "Zephyr Batteries", "Alcove Software",
    "Bramblecrest Bank", "Cinderford Glassworks", "Driftwood Games", "Ember Valley Pharma", "Foxglove Labs",
    "Granite Bay Shipping", "Harrowgate Steel", "Ironbark Construction", "Juniper Ridge Hotels",
    "Kestrel Motors", "Lumen Grove Solar", "Mistral Airways", "Northwind Ceramics", "Oxbow Logistics",
    "Pinecrest Instruments", "Redwater Chemicals", "Silverbirch Publishing", "Thistledown Toys",
    "Upland Dairy", "Verdant Seeds", "Willowmere Furniture",
)
# Professions are values, not entities: both splits use them.
PROFESSIONS: tuple[str, ...] = (
    "architect", "pilot", "dentist", "engineer", "librarian", "carpenter", "chemist", "journalist", "nurse",
    "economist", "photographer", "surgeon", "translator", "geologist", "violinist", "baker", "astronomer",
    "lawyer", "electrician", "veterinarian", "actor", "accountant", "sculptor", "pharmacist",
)

# Word pools for the prose passages of synth.py. Film titles are ADJECTIVE + NOUN ("The Quiet Harbour"); the split
# divides the nouns, so train and eval films never share a title. Towns, rivers and stadiums are invented names,
# split the same way. Industries and genres are values, used by both splits.
TITLE_ADJECTIVES: tuple[str, ...] = (
    "Quiet", "Silver", "Last", "Hidden", "Broken", "Northern", "Crimson", "Distant", "Hollow", "Golden",
    "Restless", "Forgotten", "Burning", "Salt", "Winter", "Paper",
)
TITLE_NOUNS: tuple[str, ...] = (
    "Harbour", "Orchard", "Lantern", "Meridian", "Ferry", "Archive", "Garden", "Signal", "Tide", "Compass",
    "Quarry", "Lighthouse", "Ledger", "Carousel", "Horizon", "Mirror", "Furnace", "Pavilion", "Threshold",
    "Aviary", "Cathedral", "Kingdom", "Voyage", "Embassy", "Frontier", "Gallery", "Meadow", "Monsoon",
)
TOWNS: tuple[str, ...] = (
    "Ardmoray", "Belcastre", "Corvanne", "Dellingham", "Estravel", "Falkmoor", "Glenharrow", "Hollisburg",
    "Istremont", "Junipera", "Kelvaston", "Lorwick", "Maribeck", "Nettlecombe", "Orsanne", "Pryddon",
    "Quenlow", "Rivenhall", "Solbrecht", "Tavermont", "Ulverholm", "Valdoria", "Wenscombe", "Yarrowfield",
    "Zorvath", "Ambrosk", "Brennock", "Castellow", "Dunvegan Ford", "Elmsbridge",
)
RIVERS: tuple[str, ...] = (
    "Aldwater", "Brenna", "Calder Run", "Dovey", "Elver", "Fennick", "Glasswater", "Harl", "Isbourne",
    "Jessop", "Kennet Vale", "Lathe", "Morrow", "Nene Vale", "Ouseby", "Pellow", "Rushmere", "Sorrel",
)
INDUSTRIES: tuple[str, ...] = (
    "logistics", "software", "shipbuilding", "publishing", "textile", "pharmaceutical", "insurance", "mining",
    "food processing", "aerospace", "telecommunications", "furniture", "renewable energy", "banking",
)
GENRES: tuple[str, ...] = ("drama", "thriller", "comedy", "science fiction", "war", "mystery", "musical", "romance")
CLUB_SUFFIXES: tuple[str, ...] = ("Rovers", "Athletic", "United", "Wanderers", "Harriers", "Rangers")
ARENA_WORDS: tuple[str, ...] = ("Park", "Arena", "Stadium", "Ground", "Field")
