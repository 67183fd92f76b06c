"""The arena's database (SQLAlchemy; SQLite in a file by default, PostgreSQL by URL): the competition, its
teams, their uploads (what the rate limit counts), their submissions with the uploaded files, and each
kata's grading result.

The database is the grading queue: a submission is `queued` when stored, `running` while graded and
`graded` at the end, and a kata's result is one row per (submission, kata), so a server started again
grades exactly the katas that have no row yet. Several servers may share one database: a `running`
submission names its owner and a lease the owner renews, and a server takes over only what a dead server
held (its lease ran out); a team's uploads are counted under a lock on its row (`lock_team`), so the rate
limit holds across servers. Tokens are stored only as SHA-256 hashes. Every text of a
grading result is valid UTF-8 as it is stored and again as it is read (`valid_text`): an exception's
message may hold a lone surrogate, which no page or JSON answer could encode; and it names a team's file
as the team knows it, `NN_name/solution.py`, never by the grading machine's scratch path where the fleet
staged it (`team_paths`).

A team's name is stored normalised (`team_name`: NFKC, no invisible characters, whitespace collapsed; no
control character) and refused when it reads like an existing team's (`name_key`: the same without case
or look-alike letters of other scripts), so two rows on the board never look the same. A database URL is
shown with its password masked (`shown_url`).

May import: the standard library (and SQLAlchemy).
"""
from __future__ import annotations

import datetime
import hashlib
import re
import secrets
import unicodedata
from contextlib import contextmanager

from sqlalchemy import (JSON, Boolean, DateTime, Float, ForeignKey, Integer, LargeBinary, String, TypeDecorator,
                        UniqueConstraint, create_engine, event, inspect, make_url, select, text, update)
from sqlalchemy.exc import ArgumentError, IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

DEFAULT_DB = "sqlite:///arena.db"


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)  # stored as naive UTC


def utc_moment(text: str) -> datetime.datetime:
    """An ISO time as stored (naive UTC): with an offset ("Z" included) converted, without one read as UTC.
    ValueError for text that is no ISO time."""
    moment = datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return moment.astimezone(datetime.timezone.utc).replace(tzinfo=None) if moment.tzinfo else moment


def submission_row(session: Session, sid: int) -> "Submission | None":
    """Submission `sid`, or None; an id over 64 bits (which the database cannot even compare) is no row's."""
    return session.get(Submission, sid) if 0 < sid < 2**63 else None


def new_token() -> str:
    """A secret for a team or the organiser; never one that starts with '-', which a command line such as
    `score.py --submit URL --token TOKEN` reads as an option (1 token in 64 did)."""
    while (token := secrets.token_urlsafe(24)).startswith("-"):
        pass
    return token


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _each_string(value, change, *, keys: bool = False):
    """`value` (what JSON holds) with `change` applied to every string in it (and to dict keys if `keys`)."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {(_each_string(k, change, keys=keys) if keys else k): _each_string(v, change, keys=keys)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_each_string(v, change, keys=keys) for v in value]
    return value


def _valid_string(text: str) -> str:
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def valid_text(value):
    """`value` (what JSON holds) with every string valid UTF-8: a lone surrogate becomes its backslash
    escape (\\ud800), so the text stays readable and every answer can encode it."""
    return _each_string(value, _valid_string, keys=True)


# A file the fleet staged for grading: <the Dask worker's scratch>/fx-katas-team-XXXX/NN_name/solution.py
# (graders/competition/nurseries.py), or any other absolute path to a kata's solution file.
_STAGED_QUOTED = re.compile(r"""(?<![^\s(\[=:])(["'`])[^"'`\n]*/fx-katas-team-[A-Za-z0-9_]+/""")  # a quoted path may hold spaces
_STAGED = re.compile(r"""(?:[^\s'"`()\[\]<>,;]*/)?fx-katas-team-[A-Za-z0-9_]+(?:/|\b)""")
_ABSOLUTE_SOLUTION = re.compile(r"""(?<![\w.~])(?:/[^\s'"`()\[\]<>,;/]+)+/(\d\d_\w+/solution\.py)\b""")


def team_paths(value):
    """`value` (what JSON holds) with every path of a staged solution file shown as the team knows it:
    `/tmp/dask-scratch-space/worker-x/fx-katas-team-y/04_dce/solution.py` reads `04_dce/solution.py`, and
    the staged folder alone reads "the team's folder"."""
    return _each_string(value, _team_path)


def _team_path(text: str) -> str:
    if "/" not in text:
        return text
    text = _STAGED_QUOTED.sub(r"\1", text)
    text = _STAGED.sub(lambda m: "" if m.group(0).endswith("/") else "the team's folder", text)
    return _ABSOLUTE_SOLUTION.sub(r"\1", text)


class TextJSON(TypeDecorator):
    """JSON whose strings are valid UTF-8 and name no scratch path when stored, and again when read (a
    row stored before holds what it holds)."""
    impl = JSON
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return team_paths(valid_text(value))

    def process_result_value(self, value, dialect):
        return team_paths(valid_text(value))


def shown_url(url: str) -> str:
    """The database URL as printed: its password masked (postgresql://arena:***@host/arena)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)


MAX_NAME = 100
# Letters of Cyrillic and Greek drawn like a Latin letter (and a few Latin variants NFKC keeps): names
# that differ only by these read the same on the board. Compared before case is folded, so an upper-case
# look-alike maps to its upper-case twin.
LOOK_ALIKES = str.maketrans({
    **dict(zip("АВЕЅІЈКМНОРСТХУ", "ABESIJKMHOPCTXY")), **dict(zip("аеѕіјорсухԁһӏԛԝ", "aesijopcyxdhlqw")),
    **dict(zip("ΑΒΕΖΗΙΚΜΝΟΡΤΥΧ", "ABEZHIKMNOPTYX")), **dict(zip("αικνορυ", "aikvopu")),
    **dict(zip("ıɑɡꞮ", "iagI")),
})
# Invisible characters that are not format characters (category Cf): a combining grapheme joiner, the
# Hangul fillers, variation selectors.
INVISIBLE = set("\u034f\u115f\u1160\u3164\uffa0\u17b4\u17b5\u180b\u180c\u180d\u180e\u180f") | {chr(c) for c in range(0xFE00, 0xFE10)}


class NameRefused(ValueError):
    """A team name that cannot be used; the message says why, in one sentence."""


class NameTaken(NameRefused):
    """A team name that reads like an existing team's."""


def _visible(text: str) -> str:
    """NFKC, without format characters (zero-width spaces and joiners, direction marks) or other invisible
    ones, each run of whitespace one space, none at the ends."""
    text = "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) != "Cf" and c not in INVISIBLE)
    return " ".join(unicodedata.normalize("NFKC", text).split())


def team_name(text: str) -> str:
    """The name as stored (`_visible`). Refused (NameRefused): a control character (NUL among them) other
    than whitespace, a lone surrogate, nothing left, over MAX_NAME characters, or only dots (its page's
    address would climb)."""
    bad = next((c for c in text if unicodedata.category(c) in ("Cc", "Cs") and c not in "\t\n\r"), None)
    if bad is not None:
        raise NameRefused(f"a team name may not hold control characters (it holds U+{ord(bad):04X})")
    name = _visible(text)
    if not name or len(name) > MAX_NAME:
        raise NameRefused(f"a team name has 1 to {MAX_NAME} visible characters")
    if set(name) == {"."}:
        raise NameRefused("a team name may not be only dots")
    return name


def name_key(name: str) -> str:
    """What a name reads as: two names with the same key look the same on the board."""
    return unicodedata.normalize("NFKC", _visible(name).translate(LOOK_ALIKES).casefold())


class Base(DeclarativeBase):
    pass


class Competition(Base):
    __tablename__ = "competition"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    katas: Mapped[list] = mapped_column(JSON)
    closes_at: Mapped[datetime.datetime | None] = mapped_column(DateTime, nullable=True)
    rate_limit: Mapped[int] = mapped_column(Integer)       # submissions per team ...
    rate_window: Mapped[float] = mapped_column(Float)     # ... in this many seconds
    speed: Mapped[bool] = mapped_column(Boolean, default=True)
    seed: Mapped[int] = mapped_column(Integer)            # secret until closed
    organiser_hash: Mapped[str] = mapped_column(String(64))
    closed: Mapped[bool] = mapped_column(Boolean, default=False)
    created: Mapped[datetime.datetime] = mapped_column(DateTime, default=now)
    # From this moment the public board stops moving (graders/arena/controls.py); the close reveals.
    frozen_at: Mapped[datetime.datetime | None] = mapped_column(DateTime, nullable=True)


class Team(Base):
    __tablename__ = "team"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)


class Upload(Base):
    """An upload by a team that its token, the closing time and the rate limit let through, from before it
    is unpacked: `pending`, then `stored` (its submission) or `refused` (the sentence). The rate limit
    counts a team's submissions and its uploads not stored, so a refused upload counts as one too."""
    __tablename__ = "upload"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("team.id"), index=True)
    created: Mapped[datetime.datetime] = mapped_column(DateTime, default=now, index=True)
    outcome: Mapped[str] = mapped_column(String(16), default="pending")  # pending, stored, refused
    reason: Mapped[str | None] = mapped_column(String(500), nullable=True)
    submission_id: Mapped[int | None] = mapped_column(ForeignKey("submission.id"), nullable=True)


class Submission(Base):
    __tablename__ = "submission"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("team.id"), index=True)
    created: Mapped[datetime.datetime] = mapped_column(DateTime, default=now, index=True)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)  # queued, running, graded
    katas: Mapped[list] = mapped_column(JSON)             # the katas this submission is graded on
    files_hash: Mapped[str] = mapped_column(String(64))
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # gradings started (a restart adds one)
    # While `running`: the server grading it and until when its claim holds. The owner renews the lease as it
    # grades; a server takes over only a submission whose lease ran out (its owner died), never a live one's.
    owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_until: Mapped[datetime.datetime | None] = mapped_column(DateTime, nullable=True)
    # Set by the organiser (disqualified or ignored, with the reason): the submission counts for nothing.
    excluded: Mapped[str | None] = mapped_column(String(500), nullable=True)
    total_points: Mapped[float | None] = mapped_column(Float, nullable=True)
    graded_at: Mapped[datetime.datetime | None] = mapped_column(DateTime, nullable=True)


class SubmittedFile(Base):
    __tablename__ = "submitted_file"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    submission_id: Mapped[int] = mapped_column(ForeignKey("submission.id"), index=True)
    path: Mapped[str] = mapped_column(String(200))        # NN_name/solution.py
    content: Mapped[bytes] = mapped_column(LargeBinary)


class KataResult(Base):
    __tablename__ = "kata_result"
    __table_args__ = (UniqueConstraint("submission_id", "kata"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    submission_id: Mapped[int] = mapped_column(ForeignKey("submission.id"), index=True)
    kata: Mapped[str] = mapped_column(String(64))
    points: Mapped[float] = mapped_column(Float)
    summary: Mapped[dict] = mapped_column(TextJSON)       # graders.batch.summary.summarise's dict, scanned
    graded_at: Mapped[datetime.datetime] = mapped_column(DateTime, default=now)


class Rejudging(Base):
    """A set of submissions graded again (after a grader fix, say), kept apart until the organiser applies it
    (each new verdict replaces the old, which is kept as superseded) or discards it. `queued` while graded,
    `ready` once every item is, then `applied` or `discarded`."""
    __tablename__ = "rejudging"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created: Mapped[datetime.datetime] = mapped_column(DateTime, default=now)
    scope: Mapped[str] = mapped_column(String(500))
    status: Mapped[str] = mapped_column(String(16), default="queued")


class RejudgeItem(Base):
    """One submission of a rejudging, claimed and leased by a server as a submission is."""
    __tablename__ = "rejudge_item"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rejudging_id: Mapped[int] = mapped_column(ForeignKey("rejudging.id"), index=True)
    submission_id: Mapped[int] = mapped_column(ForeignKey("submission.id"))
    katas: Mapped[list] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)  # queued, running, graded
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_until: Mapped[datetime.datetime | None] = mapped_column(DateTime, nullable=True)


class RejudgedResult(Base):
    """A kata's new verdict in a rejudging, beside the one on the board until the rejudging is applied."""
    __tablename__ = "rejudged_result"
    __table_args__ = (UniqueConstraint("rejudging_id", "submission_id", "kata"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rejudging_id: Mapped[int] = mapped_column(ForeignKey("rejudging.id"), index=True)
    submission_id: Mapped[int] = mapped_column(ForeignKey("submission.id"))
    kata: Mapped[str] = mapped_column(String(64))
    points: Mapped[float] = mapped_column(Float)
    summary: Mapped[dict] = mapped_column(TextJSON)


class SupersededResult(Base):
    """A verdict a rejudging replaced: kept, with the rejudging that replaced it."""
    __tablename__ = "superseded_result"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    submission_id: Mapped[int] = mapped_column(ForeignKey("submission.id"), index=True)
    kata: Mapped[str] = mapped_column(String(64))
    points: Mapped[float] = mapped_column(Float)
    summary: Mapped[dict] = mapped_column(TextJSON)
    rejudging_id: Mapped[int] = mapped_column(ForeignKey("rejudging.id"))
    superseded_at: Mapped[datetime.datetime] = mapped_column(DateTime, default=now)


class Announcement(Base):
    """A message from the organiser to every team, shown on the board."""
    __tablename__ = "announcement"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created: Mapped[datetime.datetime] = mapped_column(DateTime, default=now)
    text: Mapped[str] = mapped_column(String(2000))


class ControlLog(Base):
    """What the organiser did (freeze, exclude, include, announce, rejudge ...), when, to what and why."""
    __tablename__ = "control_log"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created: Mapped[datetime.datetime] = mapped_column(DateTime, default=now)
    action: Mapped[str] = mapped_column(String(32))
    target: Mapped[str | None] = mapped_column(String(200), nullable=True)
    reason: Mapped[str | None] = mapped_column(String(2000), nullable=True)


class Database:
    def __init__(self, url: str = DEFAULT_DB):
        self.url = url
        sqlite = url.startswith("sqlite")
        self.engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30} if sqlite else {},
                                    pool_pre_ping=not sqlite)
        if sqlite:
            @event.listens_for(self.engine, "connect")
            def _pragmas(connection, _record):  # readers never wait behind the grading thread's writes
                cursor = connection.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=FULL")  # an acknowledged submission survives a power cut
                cursor.execute("PRAGMA foreign_keys=ON")
                cursor.close()
        Base.metadata.create_all(self.engine)
        self._add_missing_columns()
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    def _add_missing_columns(self) -> None:
        """Columns added to a table since a database was created (create_all makes only missing tables): a
        competition's database keeps working after an upgrade."""
        inspector = inspect(self.engine)
        with self.engine.begin() as connection:
            for table in Base.metadata.sorted_tables:
                have = {c["name"] for c in inspector.get_columns(table.name)}
                for column in table.columns:
                    if column.name not in have and column.nullable:
                        kind = column.type.compile(dialect=self.engine.dialect)
                        connection.execute(text(f'ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}'))

    def lock_team(self, session: Session, team_id: int) -> None:
        """Serialise this transaction with every other that locks the team, in any process on the database:
        a write to the team's row (PostgreSQL: its row lock; SQLite: the database's write lock), so what is
        read after it (the rate limit's count) is what every other server has committed."""
        session.execute(update(Team).where(Team.id == team_id).values(token_hash=Team.token_hash))

    @contextmanager
    def session(self):
        with self.sessions() as session, session.begin():
            yield session

    def competition(self, session: Session) -> Competition | None:
        return session.scalars(select(Competition).order_by(Competition.id.desc()).limit(1)).first()

    def team_by_token(self, session: Session, token: str | None) -> Team | None:
        return session.scalars(select(Team).where(Team.token_hash == token_hash(token))).first() if token else None

    @property
    def shown_url(self) -> str:
        return shown_url(self.url)

    def add_team(self, text: str) -> tuple[str, str]:
        """Add a team: (its name as stored, its token, shown once). NameRefused (a sentence) for a name
        team_name refuses or one that reads like an existing team's (name_key)."""
        name, token = team_name(text), new_token()
        key = name_key(name)
        try:
            with self.session() as session:
                same = next((other for other in session.scalars(select(Team.name)) if name_key(other) == key), None)
                if same is not None:
                    raise NameTaken(f"a team named {same!r} exists already" + (
                        "" if same == name else f", and {name!r} reads the same (names are compared without case, "
                                                "invisible characters or look-alike letters)"))
                session.add(Team(name=name, token_hash=token_hash(token)))
        except IntegrityError:  # added by another process meanwhile
            raise NameTaken(f"a team named {name!r} exists already") from None
        return name, token

    def is_organiser(self, session: Session, token: str | None) -> bool:
        competition = self.competition(session)
        return bool(token and competition and secrets.compare_digest(competition.organiser_hash, token_hash(token)))
