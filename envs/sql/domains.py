"""Schemas of the built-in text-to-SQL databases: ten domains, each with two entities and a linking table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Column:
    """``kind``: key | label | cat | int | real | fk; ``spec``: values, range or referenced table."""

    name: str
    kind: str
    phrase: str
    spec: tuple = ()


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    singular: str
    plural: str
    columns: tuple[Column, ...]
    num_rows: int


@dataclass(frozen=True, slots=True)
class Domain:
    db_id: str
    tables: tuple[Table, ...]


# fmt: off
FIRST = ("Alice", "Bruno", "Chen", "Dana", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kenji",
         "Lena", "Marco", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wei",
         "Yara", "Zoe")
LAST = ("Adams", "Baker", "Costa", "Diaz", "Evans", "Fischer", "Garcia", "Hansen", "Ito", "Jensen", "Khan",
        "Lopez", "Moreau", "Nakamura", "Okafor", "Patel", "Rossi", "Silva", "Tanaka", "Umeh", "Varga",
        "Weber", "Young")
# fmt: on
PERSON = (FIRST, LAST)
CITIES = ("Boston", "Denver", "Austin", "Seattle", "Chicago", "Miami", "Portland", "Atlanta")
COUNTRIES = ("USA", "Canada", "Germany", "France", "Japan", "Brazil", "India", "Spain")


def key() -> Column:
    return Column("id", "key", "id")


def label(name: str, phrase: str, words: tuple) -> Column:
    return Column(name, "label", phrase, words)


def cat(name: str, phrase: str, values: tuple) -> Column:
    return Column(name, "cat", phrase, values)


def num(name: str, phrase: str, lo: float, hi: float, real: bool = False) -> Column:
    return Column(name, "real" if real else "int", phrase, (lo, hi))


def fk(name: str, table: str) -> Column:
    return Column(name, "fk", table, (table,))


def _t(name: str, singular: str, plural: str, num_rows: int, *columns: Column) -> Table:
    return Table(name, singular, plural, (key(), *columns), num_rows)


# fmt: off
DOMAINS: tuple[Domain, ...] = (
    Domain("retail", (
        _t("customers", "customer", "customers", 60, label("name", "name", PERSON),
           cat("city", "city", CITIES),
           cat("segment", "segment", ("Consumer", "Corporate", "Small Business")), num("age", "age", 18, 80)),
        _t("products", "product", "products", 40,
           label("name", "name", (("Smart", "Classic", "Eco", "Ultra", "Mini", "Pro"),
                                  ("Lamp", "Kettle", "Chair", "Backpack", "Speaker", "Blender", "Desk",
                                   "Camera"))),
           cat("category", "category", ("Home", "Kitchen", "Electronics", "Outdoor", "Office")),
           num("price", "price", 5, 900, real=True), num("stock", "stock", 0, 500)),
        _t("orders", "order", "orders", 300, fk("customer_id", "customers"), fk("product_id", "products"),
           num("quantity", "quantity", 1, 12), num("order_year", "order year", 2018, 2024),
           cat("channel", "sales channel", ("Online", "Store", "Phone"))),
    )),
    Domain("hr", (
        _t("departments", "department", "departments", 12,
           label("name", "name", (("Global", "Regional", "Central"),
                                  ("Sales", "Finance", "Research", "Support", "Legal", "Marketing"))),
           cat("city", "city", CITIES), num("budget", "budget", 100_000, 5_000_000, real=True)),
        _t("projects", "project", "projects", 40,
           label("title", "title", (("Apollo", "Beacon", "Cobalt", "Delta", "Falcon", "Granite", "Horizon"),
                                    ("Migration", "Launch", "Audit", "Redesign", "Rollout", "Study"))),
           cat("status", "status", ("Planned", "Active", "Done", "Paused")),
           num("start_year", "start year", 2015, 2024)),
        _t("employees", "employee", "employees", 120, label("name", "name", PERSON),
           fk("department_id", "departments"), fk("project_id", "projects"),
           cat("job_title", "job title", ("Engineer", "Analyst", "Manager", "Designer", "Intern")),
           num("salary", "salary", 30_000, 190_000, real=True), num("hire_year", "hire year", 2005, 2024)),
    )),
    Domain("flights", (
        _t("airlines", "airline", "airlines", 15,
           label("name", "name", (("Sky", "Blue", "North", "Pacific", "Star"),
                                  ("Air", "Jet", "Wings", "Airways"))), cat("country", "country", COUNTRIES),
           num("fleet_size", "fleet size", 10, 400)),
        _t("airports", "airport", "airports", 20,
           label("code", "code", (("B", "D", "K", "L", "M", "S"), ("AX", "EN", "OS", "RT", "UQ"))),
           cat("city", "city", CITIES), num("elevation", "elevation", 0, 1800)),
        _t("flights", "flight", "flights", 300, fk("airline_id", "airlines"), fk("airport_id", "airports"),
           num("distance", "distance", 200, 6000), num("price", "price", 49, 1500, real=True),
           cat("status", "status", ("On Time", "Delayed", "Cancelled"))),
    )),
    Domain("school", (
        _t("students", "student", "students", 80, label("name", "name", PERSON),
           num("grade_level", "grade level", 9, 12), cat("city", "city", CITIES),
           num("gpa", "GPA", 1.5, 4.0, real=True)),
        _t("courses", "course", "courses", 20,
           label("title", "title", (("Intro to", "Advanced", "Applied"),
                                    ("Algebra", "Biology", "Chemistry", "History", "Poetry", "Physics",
                                     "Art"))),
           cat("subject", "subject", ("Math", "Science", "Humanities", "Arts")),
           num("credits", "credits", 1, 5)),
        _t("enrollments", "enrollment", "enrollments", 320, fk("student_id", "students"),
           fk("course_id", "courses"), num("score", "score", 40, 100, real=True),
           cat("semester", "semester", ("Fall", "Spring", "Summer"))),
    )),
    Domain("library", (
        _t("books", "book", "books", 40,
           label("title", "title", (("The Silent", "A Distant", "The Last", "Hidden", "Broken", "The Golden"),
                                    ("River", "Garden", "Empire", "Letter", "Voyage", "Mirror", "Harbor"))),
           cat("genre", "genre", ("Fiction", "Mystery", "Science", "History", "Fantasy")),
           num("pages", "page count", 90, 900), num("publish_year", "publication year", 1950, 2024)),
        _t("members", "member", "members", 60, label("name", "name", PERSON), cat("city", "city", CITIES),
           cat("membership", "membership type", ("Basic", "Premium", "Student"))),
        _t("loans", "loan", "loans", 300, fk("book_id", "books"), fk("member_id", "members"),
           num("loan_year", "loan year", 2019, 2024), num("days_kept", "days kept", 1, 60)),
    )),
    Domain("music", (
        _t("artists", "artist", "artists", 30,
           label("name", "name", (("The", "Velvet", "Neon", "Electric", "Lunar"),
                                  ("Foxes", "Echoes", "Tides", "Riot", "Pilots", "Saints"))),
           cat("genre", "genre", ("Rock", "Jazz", "Pop", "Hip Hop", "Folk")),
           cat("country", "country", COUNTRIES), num("debut_year", "debut year", 1970, 2022)),
        _t("venues", "venue", "venues", 20,
           label("name", "name", (("Royal", "Grand", "Blue", "Old"),
                                  ("Hall", "Arena", "Theater", "Club", "Dome"))), cat("city", "city", CITIES),
           num("capacity", "capacity", 200, 20_000)),
        _t("concerts", "concert", "concerts", 260, fk("artist_id", "artists"), fk("venue_id", "venues"),
           num("year", "year", 2015, 2024), num("tickets_sold", "tickets sold", 50, 20_000),
           num("ticket_price", "ticket price", 15, 250, real=True)),
    )),
    Domain("hospital", (
        _t("doctors", "doctor", "doctors", 30, label("name", "name", PERSON),
           cat("specialty", "specialty", ("Cardiology", "Neurology", "Pediatrics", "Oncology", "Surgery")),
           num("years_experience", "years of experience", 1, 40)),
        _t("patients", "patient", "patients", 90, label("name", "name", PERSON), cat("city", "city", CITIES),
           num("age", "age", 1, 95), cat("insurance", "insurance plan", ("Public", "Private", "None"))),
        _t("appointments", "appointment", "appointments", 320, fk("doctor_id", "doctors"),
           fk("patient_id", "patients"), num("year", "year", 2018, 2024),
           num("cost", "cost", 40, 2500, real=True),
           cat("status", "status", ("Completed", "Cancelled", "No Show"))),
    )),
    Domain("sports", (
        _t("teams", "team", "teams", 16,
           label("name", "name", (("Red", "Iron", "Golden", "Storm", "River"),
                                  ("Hawks", "Bears", "Lions", "Rovers"))), cat("city", "city", CITIES),
           cat("league", "league", ("East", "West", "Central")),
           num("founded_year", "founding year", 1890, 2010)),
        _t("players", "player", "players", 90, label("name", "name", PERSON),
           cat("position", "position", ("Goalkeeper", "Defender", "Midfielder", "Forward")),
           cat("nationality", "nationality", COUNTRIES), num("age", "age", 17, 39)),
        _t("contracts", "contract", "contracts", 220, fk("player_id", "players"), fk("team_id", "teams"),
           num("season", "season", 2016, 2024), num("salary", "salary", 50_000, 9_000_000, real=True)),
    )),
    Domain("hotel", (
        _t("hotels", "hotel", "hotels", 20,
           label("name", "name", (("Grand", "Harbor", "Summit", "Palm", "Royal"),
                                  ("Inn", "Resort", "Suites", "Lodge"))), cat("city", "city", CITIES),
           num("stars", "star rating", 1, 5), num("rooms", "number of rooms", 20, 600)),
        _t("guests", "guest", "guests", 80, label("name", "name", PERSON),
           cat("country", "country", COUNTRIES), num("age", "age", 18, 85)),
        _t("bookings", "booking", "bookings", 300, fk("hotel_id", "hotels"), fk("guest_id", "guests"),
           num("nights", "number of nights", 1, 14), num("nightly_rate", "nightly rate", 60, 900, real=True),
           num("year", "year", 2019, 2024)),
    )),
    Domain("cinema", (
        _t("movies", "movie", "movies", 30,
           label("title", "title", (("Night", "Lost", "Iron", "Last", "Wild"),
                                    ("Signal", "Kingdom", "Orbit", "Frontier", "Promise", "Storm"))),
           cat("genre", "genre", ("Drama", "Comedy", "Action", "Horror", "Animation")),
           num("release_year", "release year", 1980, 2024), num("budget", "budget", 1.0, 250.0, real=True)),
        _t("theaters", "theater", "theaters", 16,
           label("name", "name", (("Star", "Regal", "Vista", "Lux"),
                                  ("Cinema", "Screens", "Pictures", "Plaza"))), cat("city", "city", CITIES),
           num("screens", "number of screens", 1, 24)),
        _t("screenings", "screening", "screenings", 300, fk("movie_id", "movies"),
           fk("theater_id", "theaters"), num("tickets_sold", "tickets sold", 5, 450),
           num("ticket_price", "ticket price", 5, 25, real=True)),
    )),
)
# fmt: on

TEST_DOMAINS = ("hotel", "cinema")
