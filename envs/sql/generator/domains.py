"""Schemas of the built-in text-to-SQL databases: eighteen domains of four or five tables each.

Like real databases, each has entity tables (a label such as a name or title, categories, numbers),
linking tables with two foreign keys, and foreign-key chains (a table referencing a table that itself
references another: tickets -> flights -> airlines). A domain's rows are generated table by table in
catalog order, so a referenced table comes before the tables that reference it.
"""

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
class SchemaStyle:
    case: str = "snake"  # snake: order_year | title: Order_Year | camel: OrderYear
    singular_tables: bool = False
    key: str = "id"  # id | entity_id
    prefixed_labels: bool = False  # name -> customer_name
    types: str = "affinity"  # affinity: INTEGER/TEXT/REAL | sized: int/varchar(n)/real
    inline_fks: bool = False  # `x INTEGER REFERENCES t(k)` instead of a FOREIGN KEY clause
    quoted: bool = False  # "name" identifiers in the CREATE TABLE text


@dataclass(frozen=True, slots=True)
class Domain:
    db_id: str
    tables: tuple[Table, ...]
    style: SchemaStyle = SchemaStyle()  # how its CREATE TABLE text is written (envs.sql.generator.naming)


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
    return Column(name, "fk", table, (table, "id"))


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
        _t("warehouses", "warehouse", "warehouses", 12,
           label("name", "name", (("North", "South", "East", "West", "Central"),
                                  ("Depot", "Hub", "Warehouse"))),
           cat("city", "city", CITIES), num("capacity", "storage capacity", 5_000, 80_000),
           num("opened_year", "opening year", 1995, 2022)),
        _t("shipments", "shipment", "shipments", 260, fk("order_id", "orders"),
           fk("warehouse_id", "warehouses"), cat("carrier", "carrier", ("UPS", "FedEx", "DHL", "USPS")),
           num("shipping_cost", "shipping cost", 3, 120, real=True),
           num("delivery_days", "delivery time in days", 1, 14)),
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
        _t("training_courses", "training course", "training courses", 15,
           label("title", "title", (("Leadership", "Safety", "Data", "Negotiation", "Compliance", "Cloud"),
                                    ("Basics", "Workshop", "Bootcamp"))),
           cat("format", "format", ("Online", "In Person", "Hybrid")),
           num("hours", "duration in hours", 2, 40), num("cost", "cost", 200, 5_000, real=True)),
        _t("training_records", "training record", "training records", 260, fk("employee_id", "employees"),
           fk("training_course_id", "training_courses"),
           num("completion_year", "completion year", 2015, 2024),
           num("score", "score", 50, 100)),
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
        _t("passengers", "passenger", "passengers", 120, label("name", "name", PERSON),
           cat("nationality", "nationality", COUNTRIES), num("age", "age", 1, 90),
           cat("loyalty_tier", "loyalty tier", ("Basic", "Silver", "Gold", "Platinum"))),
        _t("tickets", "ticket", "tickets", 400, fk("flight_id", "flights"), fk("passenger_id", "passengers"),
           cat("seat_class", "seat class", ("Economy", "Premium Economy", "Business", "First")),
           num("fare", "fare", 39, 4_000, real=True), num("checked_bags", "number of checked bags", 0, 3)),
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
        _t("teachers", "teacher", "teachers", 15, label("name", "name", PERSON),
           cat("subject", "subject", ("Math", "Science", "Humanities", "Arts")),
           num("years_experience", "years of experience", 1, 35),
           num("salary", "salary", 38_000, 95_000, real=True)),
        _t("assessments", "assessment", "assessments", 400, fk("enrollment_id", "enrollments"),
           fk("teacher_id", "teachers"),
           cat("type", "assessment type", ("Quiz", "Midterm", "Final", "Project")),
           num("week", "week", 1, 16), num("score", "score", 0, 100, real=True)),
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
        _t("librarians", "librarian", "librarians", 12, label("name", "name", PERSON),
           cat("shift", "shift", ("Morning", "Afternoon", "Evening")),
           num("years_of_service", "years of service", 1, 30)),
        _t("fines", "fine", "fines", 120, fk("loan_id", "loans"), fk("librarian_id", "librarians"),
           num("amount", "amount", 0.5, 40, real=True), num("year", "year", 2019, 2024),
           cat("status", "payment status", ("Paid", "Unpaid", "Waived"))),
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
        _t("albums", "album", "albums", 60,
           label("title", "title", (("Midnight", "Golden", "Paper", "Silver", "Wild", "Quiet", "Burning",
                                     "Endless"),
                                    ("Hearts", "Roads", "Dreams", "Skies", "Fires", "Letters", "Waves",
                                     "Lights"))),
           fk("artist_id", "artists"), num("release_year", "release year", 1970, 2024),
           num("copies_sold", "number of copies sold", 1_000, 5_000_000),
           cat("format", "format", ("Vinyl", "CD", "Digital"))),
        _t("songs", "song", "songs", 140,
           label("title", "title", (("Blue", "Falling", "Sweet", "Lonely", "Broken", "Dancing", "Electric",
                                     "Summer", "Midnight", "Golden", "Secret", "Wild"),
                                    ("Rain", "Heart", "Road", "Fire", "Sky", "Night", "Love", "River",
                                     "Dream", "Light", "Moon", "Home"))),
           fk("album_id", "albums"), num("duration", "length in seconds", 120, 420),
           num("streams", "number of streams", 1_000, 50_000_000)),
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
        _t("medications", "medication", "medications", 25,
           label("name", "name", (("Amoxicillin", "Lisinopril", "Metformin", "Atorvastatin", "Omeprazole",
                                   "Sertraline", "Ibuprofen", "Amlodipine", "Levothyroxine", "Albuterol",
                                   "Gabapentin", "Losartan", "Simvastatin", "Prednisone", "Warfarin",
                                   "Insulin", "Azithromycin", "Ciprofloxacin", "Hydrochlorothiazide",
                                   "Montelukast", "Furosemide", "Clopidogrel", "Pantoprazole", "Citalopram",
                                   "Tramadol"),)),
           cat("form", "form", ("Tablet", "Capsule", "Liquid", "Injection")),
           num("unit_price", "unit price", 2, 400, real=True)),
        _t("prescriptions", "prescription", "prescriptions", 350, fk("appointment_id", "appointments"),
           fk("medication_id", "medications"), num("dose_mg", "dose in milligrams", 5, 1_000),
           num("days", "number of days", 3, 90), num("refills", "number of refills", 0, 5)),
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
        _t("stadiums", "stadium", "stadiums", 14,
           label("name", "name", (("Victory", "Memorial", "Liberty", "Riverside", "Eagle", "Union"),
                                  ("Stadium", "Park", "Field", "Arena"))),
           fk("team_id", "teams"), cat("city", "city", CITIES), num("capacity", "capacity", 8_000, 90_000),
           num("opened_year", "opening year", 1900, 2020)),
        _t("matches", "match", "matches", 240, fk("stadium_id", "stadiums"),
           num("season", "season", 2016, 2024), num("attendance", "attendance", 2_000, 90_000),
           num("home_goals", "number of home goals", 0, 6),
           num("away_goals", "number of away goals", 0, 6),
           cat("competition", "competition", ("League", "Cup", "Friendly"))),
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
        _t("staff", "staff member", "staff members", 90, label("name", "name", PERSON),
           fk("hotel_id", "hotels"),
           cat("role", "role", ("Receptionist", "Housekeeper", "Chef", "Concierge", "Manager")),
           num("salary", "salary", 22_000, 120_000, real=True)),
        _t("payments", "payment", "payments", 300, fk("booking_id", "bookings"),
           cat("method", "payment method", ("Credit Card", "Debit Card", "Cash", "Bank Transfer")),
           num("amount", "amount", 60, 9_000, real=True), num("year", "year", 2019, 2024)),
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
        _t("employees", "employee", "employees", 70, label("name", "name", PERSON),
           fk("theater_id", "theaters"),
           cat("role", "role", ("Projectionist", "Usher", "Cashier", "Manager")),
           num("hourly_wage", "hourly wage", 12, 40, real=True), num("hire_year", "hire year", 2008, 2024)),
        _t("concession_sales", "concession sale", "concession sales", 350, fk("screening_id", "screenings"),
           cat("item", "item", ("Popcorn", "Soda", "Nachos", "Candy", "Hot Dog")),
           num("quantity", "quantity", 1, 6), num("revenue", "revenue", 3, 60, real=True)),
    )),
    Domain("university", (
        _t("departments", "department", "departments", 10,
           label("name", "name", (("Computer Science", "Mathematics", "Physics", "Chemistry", "Biology",
                                   "History", "Economics", "Philosophy", "Psychology", "Linguistics"),)),
           cat("building", "building", ("Watson", "Taylor", "Packard", "Gates", "Main")),
           num("budget", "budget", 200_000, 3_000_000, real=True),
           num("founded_year", "founding year", 1880, 1990)),
        _t("instructors", "instructor", "instructors", 45, label("name", "name", PERSON),
           fk("department_id", "departments"),
           cat("rank", "academic rank", ("Lecturer", "Assistant Professor", "Associate Professor",
                                         "Professor")),
           num("salary", "salary", 50_000, 200_000, real=True)),
        _t("students", "student", "students", 160, label("name", "name", PERSON),
           fk("department_id", "departments"), num("year_of_study", "year of study", 1, 4),
           num("total_credits", "total credits", 0, 160), cat("country", "home country", COUNTRIES)),
        _t("courses", "course", "courses", 36,
           label("title", "title", (("Introduction to", "Topics in", "Advanced", "Seminar in"),
                                    ("Algorithms", "Databases", "Genetics", "Optics", "Macroeconomics",
                                     "Ethics", "Cognition", "Syntax", "Thermodynamics", "Statistics"))),
           fk("department_id", "departments"), num("credits", "credits", 1, 5),
           cat("level", "level", ("Undergraduate", "Graduate"))),
        _t("sections", "section", "sections", 150, fk("course_id", "courses"),
           fk("instructor_id", "instructors"), cat("semester", "semester", ("Fall", "Spring", "Summer")),
           num("year", "year", 2016, 2024), num("capacity", "capacity", 15, 300)),
    )),
    Domain("logistics", (
        _t("depots", "depot", "depots", 12,
           label("name", "name", (("Northern", "Southern", "Eastern", "Western", "Central", "Coastal"),
                                  ("Depot", "Hub"))),
           cat("city", "city", CITIES), num("capacity", "storage capacity in pallets", 500, 20_000),
           num("opened_year", "opening year", 1990, 2022)),
        _t("drivers", "driver", "drivers", 50, label("name", "name", PERSON), fk("depot_id", "depots"),
           cat("license_class", "license class", ("Class A", "Class B", "Class C")),
           num("years_experience", "years of experience", 1, 35),
           num("hourly_wage", "hourly wage", 18, 45, real=True)),
        _t("trucks", "truck", "trucks", 36,
           label("plate", "plate number", (("TX", "NV", "AZ", "UT", "CO", "NM"),
                                           ("104", "221", "358", "472", "590", "613", "786"))),
           fk("depot_id", "depots"),
           cat("vehicle_type", "vehicle type", ("Box Truck", "Semi", "Van", "Flatbed")),
           num("capacity_tons", "capacity in tons", 1, 40), num("model_year", "model year", 2005, 2024)),
        _t("clients", "client", "clients", 40,
           label("name", "name", (("Apex", "Blue Ridge", "Keystone", "Lakeshore", "Pinnacle", "Summit",
                                   "Vertex", "Harbor"),
                                  ("Foods", "Motors", "Pharma", "Textiles", "Electronics", "Furniture"))),
           cat("industry", "industry", ("Retail", "Manufacturing", "Healthcare", "Agriculture",
                                        "Construction")),
           cat("city", "city", CITIES)),
        _t("deliveries", "delivery", "deliveries", 400, fk("truck_id", "trucks"), fk("client_id", "clients"),
           num("weight_kg", "weight in kilograms", 50, 20_000, real=True),
           num("distance_km", "distance in kilometers", 5, 2_500),
           cat("status", "status", ("Delivered", "In Transit", "Delayed", "Returned")),
           num("year", "year", 2019, 2024)),
    )),
    Domain("restaurant_chain", (
        _t("restaurants", "restaurant", "restaurants", 15,
           label("name", "name", (("Olive", "Copper", "Golden", "Rustic", "Blue", "Little"),
                                  ("Kitchen", "Bistro", "Grill", "Table", "Tavern"))),
           cat("city", "city", CITIES),
           cat("cuisine", "cuisine", ("Italian", "Mexican", "Japanese", "American", "Indian", "French")),
           num("seats", "number of seats", 30, 250), num("opened_year", "opening year", 1985, 2023)),
        _t("menu_items", "menu item", "menu items", 40,
           label("name", "name", (("Grilled", "Spicy", "Crispy", "Roasted", "Classic", "Smoked"),
                                  ("Chicken", "Salmon", "Burger", "Tacos", "Salad", "Pasta", "Soup",
                                   "Steak"))),
           cat("course", "course", ("Starter", "Main", "Side")), num("price", "price", 4, 48, real=True),
           num("calories", "calorie count", 150, 1_400)),
        _t("waiters", "waiter", "waiters", 60, label("name", "name", PERSON),
           fk("restaurant_id", "restaurants"),
           num("hire_year", "hire year", 2010, 2024), num("hourly_wage", "hourly wage", 10, 28, real=True)),
        _t("orders", "order", "orders", 400, fk("waiter_id", "waiters"), fk("menu_item_id", "menu_items"),
           num("quantity", "quantity", 1, 8), num("tip", "tip", 0, 60, real=True),
           cat("day", "day of the week", ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
                                          "Sunday"))),
        _t("inspections", "inspection", "inspections", 90, fk("restaurant_id", "restaurants"),
           num("year", "year", 2015, 2024), num("score", "score", 60, 100),
           cat("result", "result", ("Pass", "Conditional Pass", "Fail"))),
    )),
    Domain("bank", (
        _t("branches", "branch", "branches", 12,
           label("name", "name", (("Downtown", "Uptown", "Harbor", "Airport", "Riverside", "Westfield",
                                   "Eastgate"), ("Branch", "Office"))),
           cat("city", "city", CITIES), num("opened_year", "opening year", 1950, 2020),
           num("staff_count", "number of employees", 5, 80)),
        _t("customers", "customer", "customers", 120, label("name", "name", PERSON),
           cat("city", "city", CITIES), num("age", "age", 18, 90),
           num("credit_score", "credit score", 300, 850)),
        _t("accounts", "account", "accounts", 180, fk("customer_id", "customers"),
           fk("branch_id", "branches"),
           cat("account_type", "account type", ("Checking", "Savings", "Business", "Money Market")),
           num("balance", "balance", 0, 250_000, real=True), num("opened_year", "opening year", 2000, 2024)),
        _t("transactions", "transaction", "transactions", 400, fk("account_id", "accounts"),
           cat("transaction_type", "transaction type", ("Deposit", "Withdrawal", "Transfer", "Payment")),
           num("amount", "amount", 5, 20_000, real=True), num("year", "year", 2018, 2024)),
        _t("loans", "loan", "loans", 70, fk("customer_id", "customers"), fk("branch_id", "branches"),
           cat("loan_type", "loan type", ("Mortgage", "Auto", "Personal", "Student")),
           num("amount", "amount", 1_000, 600_000, real=True),
           num("interest_rate", "interest rate", 2.5, 18, real=True),
           num("term_years", "term in years", 1, 30)),
    )),
    Domain("museum", (
        _t("museums", "museum", "museums", 12,
           label("name", "name", (("National", "Modern", "City", "Royal", "Maritime", "Contemporary"),
                                  ("Museum", "Gallery"))),
           cat("city", "city", CITIES), num("founded_year", "founding year", 1820, 2010),
           num("annual_visitors", "number of annual visitors", 20_000, 3_000_000)),
        _t("artists", "artist", "artists", 40, label("name", "name", PERSON),
           cat("nationality", "nationality", COUNTRIES), num("birth_year", "birth year", 1820, 1990),
           cat("movement", "art movement", ("Impressionism", "Cubism", "Surrealism", "Realism", "Abstract",
                                            "Pop Art"))),
        _t("artworks", "artwork", "artworks", 100,
           label("title", "title", (("Portrait of", "Study of", "View of", "Memory of", "Dream of",
                                     "Song of"),
                                    ("a Woman", "the Sea", "Autumn", "the Harbor", "a Dancer", "the City",
                                     "Night", "Spring", "a Garden", "the River", "Light", "Silence",
                                     "the Bridge", "Children", "Horses", "the Mountains", "Roses"))),
           fk("artist_id", "artists"), fk("museum_id", "museums"),
           cat("medium", "medium", ("Oil", "Watercolor", "Bronze", "Marble", "Photograph")),
           num("year_created", "year of creation", 1850, 2020),
           num("estimated_value", "estimated value in millions", 0.1, 90, real=True)),
        _t("exhibitions", "exhibition", "exhibitions", 24,
           label("title", "title", (("Modern", "Ancient", "Hidden", "Radiant", "Northern", "Forgotten"),
                                    ("Masters", "Visions", "Treasures", "Horizons", "Portraits"))),
           fk("museum_id", "museums"), num("year", "year", 2010, 2024),
           num("visitors", "number of visitors", 2_000, 400_000),
           num("ticket_price", "ticket price", 0, 35, real=True)),
        _t("exhibition_items", "exhibition item", "exhibition items", 200, fk("exhibition_id", "exhibitions"),
           fk("artwork_id", "artworks"),
           cat("room", "room", ("East Wing", "West Wing", "Main Hall", "Upper Gallery")),
           num("insurance_value", "insurance value in millions", 0.1, 120, real=True)),
    )),
    Domain("esports", (
        _t("games", "game", "games", 12,
           label("title", "title", (("Rocket", "Shadow", "Pixel", "Iron", "Galaxy", "Mystic"),
                                    ("League", "Legends", "Tactics", "Racers", "Arena", "Wars"))),
           cat("genre", "genre", ("Shooter", "Strategy", "Racing", "Fighting", "Sports", "MOBA")),
           num("release_year", "release year", 2005, 2024),
           cat("publisher", "publisher", ("Northlight", "Bitforge", "Red Comet", "Lumen Studios"))),
        _t("teams", "team", "teams", 20,
           label("name", "name", (("Phantom", "Cyber", "Nova", "Vortex", "Titan", "Apex"),
                                  ("Esports", "Gaming", "Squad", "Five"))),
           cat("region", "region", ("North America", "Europe", "Asia", "South America")),
           num("founded_year", "founding year", 2000, 2022)),
        _t("players", "player", "players", 100, label("name", "name", PERSON), fk("team_id", "teams"),
           cat("role", "role", ("Captain", "Entry", "Support", "Sniper", "Substitute")),
           num("age", "age", 16, 32), num("ranking_points", "ranking points", 0, 5_000)),
        _t("tournaments", "tournament", "tournaments", 25,
           label("name", "name", (("Winter", "Summer", "Spring", "Autumn", "Grand", "World"),
                                  ("Cup", "Open", "Invitational", "Masters", "Championship"))),
           fk("game_id", "games"), num("year", "year", 2012, 2024),
           num("prize_pool", "prize pool", 10_000, 5_000_000, real=True), cat("city", "host city", CITIES)),
        _t("placements", "placement", "placements", 300, fk("tournament_id", "tournaments"),
           fk("team_id", "teams"), num("final_rank", "final rank", 1, 16),
           num("prize_money", "prize money", 0, 1_000_000, real=True),
           num("matches_won", "number of matches won", 0, 12)),
    )),
    Domain("farming", (
        _t("counties", "county", "counties", 10,
           label("name", "name", (("Adams", "Benton", "Clark", "Douglas", "Franklin", "Grant", "Lincoln",
                                   "Marion", "Polk", "Warren"),)),
           cat("state", "state", ("Iowa", "Kansas", "Nebraska", "Ohio")),
           num("population", "population", 5_000, 400_000),
           num("area", "area in square kilometers", 300, 5_000)),
        _t("farms", "farm", "farms", 45,
           label("name", "name", (("Green", "Sunny", "Maple", "Willow", "Red Barn", "Hillside", "Cedar",
                                   "Prairie"), ("Acres", "Meadows", "Farm", "Ranch", "Orchard", "Fields"))),
           fk("county_id", "counties"),
           cat("main_product", "main product", ("Corn", "Wheat", "Soybeans", "Dairy", "Cattle", "Apples")),
           num("hectares", "size in hectares", 20, 3_000), num("workers", "number of workers", 2, 120)),
        _t("competitions", "competition", "competitions", 18,
           label("title", "title", (("County", "State", "Harvest", "Spring", "Autumn"),
                                    ("Fair", "Show", "Festival", "Expo"))),
           fk("county_id", "counties"), num("year", "year", 2010, 2024),
           num("prize_money", "prize money", 1_000, 50_000, real=True)),
        _t("entries", "entry", "entries", 260, fk("farm_id", "farms"), fk("competition_id", "competitions"),
           cat("category", "category", ("Livestock", "Produce", "Dairy", "Machinery", "Crafts")),
           num("placement", "placement", 1, 10), num("score", "score", 50, 100, real=True)),
        _t("harvests", "harvest", "harvests", 300, fk("farm_id", "farms"),
           cat("crop", "crop", ("Corn", "Wheat", "Soybeans", "Barley", "Oats", "Potatoes")),
           num("year", "year", 2014, 2024), num("yield_tons", "yield in tons", 5, 4_000, real=True),
           num("revenue", "revenue", 2_000, 1_500_000, real=True)),
    )),
    Domain("railway", (
        _t("lines", "line", "lines", 10,
           label("name", "name", (("Red", "Blue", "Green", "Orange", "Purple", "Silver", "Gold", "Yellow",
                                   "Brown", "Pink"), ("Line",))),
           cat("operator", "operator", ("National Rail", "Metro Transit", "Regional Rail")),
           num("length_km", "length in kilometers", 20, 600, real=True),
           num("opened_year", "opening year", 1870, 2015)),
        _t("stations", "station", "stations", 30,
           label("name", "name", (("North", "South", "Central", "Union", "Park", "Harbor", "Lake", "Hill",
                                   "Bridge", "Market"), ("Station", "Junction", "Terminal"))),
           fk("line_id", "lines"), cat("city", "city", CITIES),
           num("platforms", "number of platforms", 2, 16),
           num("opened_year", "opening year", 1850, 2015)),
        _t("trains", "train", "trains", 24,
           label("name", "name", (("Express", "Coastal", "Mountain", "Night", "Capital", "Silver"),
                                  ("Star", "Arrow", "Runner", "Comet", "Liner"))),
           fk("line_id", "lines"),
           cat("train_type", "train type", ("High Speed", "Intercity", "Regional", "Sleeper")),
           num("seats", "number of seats", 100, 900), num("top_speed", "top speed in km/h", 120, 320)),
        _t("passengers", "passenger", "passengers", 150, label("name", "name", PERSON),
           num("age", "age", 4, 90), cat("railcard", "railcard type", ("Student", "Senior", "Commuter"))),
        _t("tickets", "ticket", "tickets", 400, fk("train_id", "trains"), fk("passenger_id", "passengers"),
           cat("travel_class", "travel class", ("First", "Standard")),
           num("price", "price", 5, 250, real=True), num("distance_km", "distance in kilometers", 10, 900),
           num("year", "year", 2018, 2024)),
    )),
)
# fmt: on

TEST_DOMAINS = ("hotel", "cinema")
