"""The store: SQLAlchemy models, engine setup, schema checks and transactional helpers."""

from scheduler.store.engine import SchemaError, Store, default_db_url
from scheduler.store.base import Base
from scheduler.store.models import Gpu, Job, JobEvent, Node

__all__ = ["Base", "Gpu", "Job", "JobEvent", "Node", "SchemaError", "Store", "default_db_url"]
