from scheduler.cli.main import main

if __name__ == "__main__":  # guarded: the planner's spawned process re-imports this module
    main()
