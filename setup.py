"""ament_python packaging for dynshape_perception."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "dynshape_perception"
NODES = ("pointcloud_node", "tracker_node", "prediction_node", "perception_pipeline")

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    # PEP 561: the package's type hints hold for those who import it.
    package_data={PACKAGE: ["py.typed"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.py") + glob("launch/*.xml")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml") + glob("config/*.xml")),
        (f"share/{PACKAGE}/config/targets", glob("config/targets/*.yaml")),
        (f"share/{PACKAGE}/config/schema", glob("config/schema/*.json")),
        (f"share/{PACKAGE}/models", glob("models/*.npz") + glob("models/*.yaml")),
    ],
    install_requires=["setuptools"],
    # Corpus replay and parallel tuning on Ray; pinned in requirements-fleet.txt.
    extras_require={"fleet": ["ray>=2.60", "psycopg[binary]>=3.2"]},
    zip_safe=False,
    maintainer="dynshape_perception maintainers",
    maintainer_email="maintainers@dynshape-perception.invalid",
    description="Dynamic-shape perception on TVM Relax with a shape-specialising JIT runtime.",
    license="Apache-2.0",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "dynshape-perception = dynshape_perception.cli.main:main",
            # Light entry points: they handle signals before the node's heavy imports.
            *(f"{node} = {PACKAGE}.nodes.entry:{node}" for node in NODES),
        ],
    },
)
