"""The arena's database (SQLAlchemy; SQLite in a file by default, PostgreSQL by URL): the competition, its
teams, their uploads (what the rate limit counts), their submissions with the uploaded files, and each
kata's grading result.

The database is the grading queue: a submission is `queued` when stored, `running` while graded and
`graded` at the end, and a kata's result is one row per (submission, kata), so a server started again
grades exactly the katas that have no row yet. Tokens are stored only as SHA-256 hashes. Every text of a
grading result is valid UTF-8 as it is stored and again as it is read (`valid_text`): an exception's
message may hold a lone surrogate, which no page or JSON answer could encode.

May import: the standard library (and SQLAlchemy).
"""
from __future__ import annotations

import datetime
import hashlib
import secrets
from contextlib import contextmanager

from sqlalchemy import (JSON, Boolean, DateTime, Float, ForeignKey, Integer, LargeBinary, String, TypeDecorator,
                        UniqueConstraint, create_engine, event, select)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

DEFAULT_DB = "sqlite:///arena.db"


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)  # stored as naive UTC


def new_token() -> str:
    return secrets.token_urlsafe(24)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def valid_text(value):
    """`value` (what JSON holds) with every string valid UTF-8: a lone surrogate becomes its backslash
    escape (\\ud800), so the text stays readable and every answer can encode it."""
    if isinstance(value, str):
        if value.isascii():
            return value
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {valid_text(k): valid_text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [valid_text(v) for v in value]
    return value


class TextJSON(TypeDecorator):
    """JSON whose strings are valid UTF-8 when stored, and again when read (a row stored before holds
    what it holds)."""
    impl = JSON
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return valid_text(value)

    def process_result_value(self, value, dialect):
        return valid_text(value)


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
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self):
        with self.sessions() as session, session.begin():
            yield session

    def competition(self, session: Session) -> Competition | None:
        return session.scalars(select(Competition).order_by(Competition.id.desc()).limit(1)).first()

    def team_by_token(self, session: Session, token: str | None) -> Team | None:
        return session.scalars(select(Team).where(Team.token_hash == token_hash(token))).first() if token else None

    def is_organiser(self, session: Session, token: str | None) -> bool:
        competition = self.competition(session)
        return bool(token and competition and secrets.compare_digest(competition.organiser_hash, token_hash(token)))
